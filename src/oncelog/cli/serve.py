"""`oncelog serve`: a broker (single node, controller in-process), or a controller and N brokers
as processes (`--brokers N`, cli/cluster.py). The composition root of a broker: it wires broker,
storage and producer ids together."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys

import click

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.broker.net.bind_error import BindError, is_bind_failure
from oncelog.cli import logs, startup
from oncelog.cli.options import overrides as _overrides
from oncelog.cli.startup import LOG_LEVELS

log = logging.getLogger("oncelog.cli")


@click.command()
@click.argument("properties", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--override", "overrides", multiple=True, callback=_overrides, metavar="NAME=VALUE",
              help="Any broker setting under its Kafka name (repeatable), as kafka-server-start does.")
@click.option("--listeners", help="Shortcut for --override listeners=...")
@click.option("--advertised-listeners", help="Shortcut for --override advertised.listeners=...")
@click.option("--log-dirs", help="Shortcut for --override log.dirs=...")
@click.option("--controller-listener", metavar="HOST:PORT", help="Shortcut for --override controller.listener=...: "
              "where the controller listens (the in-process one, or with --brokers the cluster's); default a free "
              "port.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="INFO", show_default=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--add-scram", "add_scram", multiple=True, metavar="'SCRAM-SHA-256=[name=N,password=P]'",
              help="A SCRAM credential written at start where the user has none (kafka-storage's "
              "--add-scram syntax; repeatable; also the oncelog.add.scram property).")
@click.option("--brokers", type=int, default=0, help="Run a controller and this many broker processes "
              "sharing the data directory (a cluster on one machine); listener ports count up from "
              "the given one.")
@click.option("--overrides-fd", type=int, metavar="FD", help="Read more --override settings, a JSON object, from "
              "this inherited file descriptor (how `serve --brokers N` hands its brokers their settings: "
              "a command line is readable by every local user, a descriptor only by its process).")
def serve(properties, overrides, listeners, advertised_listeners, log_dirs, controller_listener, log_level,
          log_format, add_scram, brokers, overrides_fd) -> None:
    """Run a broker (single node, controller in-process). Ctrl-C stops it cleanly."""
    logs.configure(log_level, log_format)
    if overrides_fd is not None:
        with os.fdopen(overrides_fd) as f:
            overrides.update({str(k): str(v) for k, v in json.load(f).items()})
    for name, value in (("listeners", listeners), ("advertised.listeners", advertised_listeners),
                        ("log.dirs", log_dirs), ("controller.listener", controller_listener)):
        if value is not None:
            overrides[name] = value
    try:
        config = BrokerConfig.load(properties, overrides)
        if add_scram:
            config.update({"oncelog.add.scram": ",".join(filter(None, (config["oncelog.add.scram"], *add_scram)))})
        _bootstrap_scram(config)  # bad syntax stops the start here
    except (ConfigError, OSError, ValueError) as e:
        raise click.ClickException(f"bad configuration: {e}") from None
    if brokers:
        from oncelog.cli.cluster import serve_cluster
        serve_cluster(config, brokers, properties, overrides, log_level)
        return
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_serve(config))
    except KeyboardInterrupt:
        pass
    except Exception as e:  # noqa: BLE001 - a start failure is one line (cli/startup.py); others re-raised
        raise startup.failure(e, log_level, config.log_dirs) from None


def _bootstrap_scram(config: BrokerConfig) -> list:
    import secrets

    from oncelog.core.security.scram import parse_add_scram_list
    return parse_add_scram_list(config["oncelog.add.scram"], secrets.token_bytes)


async def _serve(config: BrokerConfig) -> None:
    from oncelog.broker.net.server import Broker
    controller = None
    broker = Broker(config)
    # SIGTERM and Ctrl-C stop the broker cleanly from here on, during the start too: a supervisor
    # that stops it as soon as it says "listening on" (tests do) killed it outright when the
    # handlers came after that line, and the next start ran recovery on every partition
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    broker.lock_directories()  # before the in-process controller opens its part of the directory
    if not config["controller.quorum.bootstrap.servers"]:
        from oncelog.controller.connection_limits import ConnectionLimits
        from oncelog.controller.embedded import start_in_process
        chost, _, cport = config["controller.listener"].rpartition(":")
        try:
            controller, reach = await start_in_process(config.log_dirs[0], _bootstrap_scram(config), host=chost,
                                                       port=int(cport),
                                                       limits=ConnectionLimits.from_settings(config.get))
        except OSError as e:
            if e.filename or not is_bind_failure(e):
                # its metadata directory (a write without a file name: a full disk's ENOSPC):
                # cli/startup.py says what to do
                raise
            raise BindError("the in-process controller", chost, int(cport), e, "controller.listener") from e
        config.update(reach)
        click.echo(f"oncelog: in-process controller on {reach['controller.quorum.bootstrap.servers']}")
    elif config["oncelog.add.scram"]:
        log.warning("oncelog.add.scram is ignored: credentials are bootstrapped by the controller "
                    "(`oncelog controller --add-scram`)")
    host, port = await broker.start()
    advertised = f"{broker.advertised_host}:{broker.advertised_port}"
    for name, (lhost, lport) in broker.bound.items():
        click.echo(f"oncelog: listener {name} ({broker.listener_security[name].protocol.name}) on {lhost}:{lport}")
    click.echo(f"oncelog: listening on {host}:{port}", err=False)
    click.echo(f"oncelog: clients connect with bootstrap.servers={advertised}"
               + (f"; metrics on http://{config['metrics.host']}:{broker.metrics_port}/metrics"
                  if broker.metrics_port else ""))
    sys.stdout.flush()
    loop.add_signal_handler(signal.SIGHUP, broker.reload_tls)
    stopped = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(broker.fatal.wait())
    await asyncio.wait([stopped, failed], return_when=asyncio.FIRST_COMPLETED)
    click.echo("oncelog: shutting down" + (f": {broker.fatal_message}" if broker.fatal.is_set() else ""))
    await broker.stop()
    if controller is not None:
        await controller.stop()
    if broker.fatal.is_set():
        raise SystemExit(2)
