"""`oncelog`: the command line, and the composition root that wires broker, storage and producer
ids together. Nothing imports this module."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import click

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.broker.net.bind_error import BindError
from oncelog.cli import logs, startup
from oncelog.cli.admin import admin
from oncelog.cli.operator import operator_commands
from oncelog.cli.perf import perf
from oncelog.cli.startup import LOG_LEVELS
from oncelog.cli.verify import verify
from oncelog.storage import cluster_credential
from oncelog.storage.cluster_credential import CredentialFileError

log = logging.getLogger("oncelog.cli")


@click.group()
@click.version_option(package_name="oncelog")
def oncelog() -> None:
    """oncelog: a Kafka-compatible log whose reason to exist is exactly-once producing."""


def _overrides(ctx, param, values) -> dict[str, str]:
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not name=value", ctx=ctx, param=param)
        out[name.strip()] = value.strip()
    return out


@oncelog.command()
@click.argument("properties", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--override", "overrides", multiple=True, callback=_overrides, metavar="NAME=VALUE",
              help="Any broker setting under its Kafka name (repeatable), as kafka-server-start does.")
@click.option("--listeners", help="Shortcut for --override listeners=...")
@click.option("--advertised-listeners", help="Shortcut for --override advertised.listeners=...")
@click.option("--log-dirs", help="Shortcut for --override log.dirs=...")
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
def serve(properties, overrides, listeners, advertised_listeners, log_dirs, log_level, log_format, add_scram,
          brokers, overrides_fd) -> None:
    """Run a broker (single node, controller in-process). Ctrl-C stops it cleanly."""
    logs.configure(log_level, log_format)
    if overrides_fd is not None:
        with os.fdopen(overrides_fd) as f:
            overrides.update({str(k): str(v) for k, v in json.load(f).items()})
    for name, value in (("listeners", listeners), ("advertised.listeners", advertised_listeners),
                        ("log.dirs", log_dirs)):
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
        raise startup.failure(e, log_level) from None


def _bootstrap_scram(config: BrokerConfig) -> list:
    import secrets

    from oncelog.core.security.scram import parse_add_scram_list
    return parse_add_scram_list(config["oncelog.add.scram"], secrets.token_bytes)


async def _serve(config: BrokerConfig) -> None:
    from oncelog.broker.net.server import Broker
    controller = None
    broker = Broker(config)
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
            if e.filename:   # its metadata directory: cli/startup.py says what to do
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
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


@oncelog.command("controller")
@click.option("--metadata-dir", required=True, help="Where the metadata log and snapshots live.")
@click.option("--listener", default="127.0.0.1:0", show_default=True, help="host:port of the controller listener.")
@click.option("--credential-file", type=click.Path(dir_okay=False),
              help="The cluster credential (JSON username/password, mode 0600; made if missing): its user is "
              "the cluster principal, with which brokers register, take producer ids and follow the "
              "metadata. Default: cluster.credential beside the metadata directory.")
@click.option("--users-file", type=click.Path(exists=True, dir_okay=False),
              help="More SASL/PLAIN users, a JSON object name -> password (mode 0600): they may log in and "
              "get CLUSTER_AUTHORIZATION_FAILED, or a closed connection, for everything.")
@click.option("--session-timeout-ms", default=3000, show_default=True, help="A broker silent this long is dead.")
@click.option("--producer-id-floor", default=0, show_default=True, help="Never issue producer ids below this.")
@click.option("--add-scram", "add_scram", multiple=True, help="A SCRAM credential written when the metadata "
              "log is new (kafka-storage's --add-scram syntax; repeatable; ignored, with a warning, after).")
@click.option("--ssl-keystore-location", type=click.Path(exists=True, dir_okay=False),
              help="PEM with key and certificate chain: the listener speaks TLS (brokers set "
              "controller.listener.names and listener.name.<name>.ssl.truststore.location).")
@click.option("--override", "overrides", multiple=True, callback=_overrides, metavar="NAME=VALUE",
              help="connections.max.idle.ms, sasl.server.max.receive.size or "
              "connection.failed.authentication.delay.ms (Kafka's names and defaults; repeatable).")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="INFO", show_default=True)
def controller_command(metadata_dir, listener, credential_file, users_file, session_timeout_ms, producer_id_floor,
                       add_scram, ssl_keystore_location, overrides, log_level) -> None:
    """Run a controller on its own (for `serve --brokers N` and tests)."""
    from oncelog.controller.connection_limits import SETTINGS, ConnectionLimits
    from oncelog.controller.service import Controller, ControllerConfig
    logs.configure(log_level)
    unknown = sorted(set(overrides) - set(SETTINGS))
    if unknown:
        raise click.ClickException(f"the controller takes no setting {', '.join(unknown)} "
                                   f"(only {', '.join(SETTINGS)})")
    try:
        limits = ConnectionLimits.from_settings(overrides.get)
    except ValueError as e:
        raise click.ClickException(f"bad configuration: {e}") from None
    host, _, port = listener.rpartition(":")
    import secrets

    from oncelog.core.security.scram import AddScramError, parse_add_scram
    try:
        credential = cluster_credential.load_or_create(
            credential_file or cluster_credential.path_in(Path(metadata_dir).resolve().parent))
        users = {str(k): str(v) for k, v in json.loads(cluster_credential.read_private(users_file)).items()} \
            if users_file else {}
        scram = [parse_add_scram(a, secrets.token_bytes) for a in add_scram]
    except (AddScramError, CredentialFileError, ValueError, AttributeError) as e:
        raise click.ClickException(str(e)) from None
    users[credential.username] = credential.password
    tls = None
    if ssl_keystore_location:
        import ssl
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_cert_chain(ssl_keystore_location)

    async def run() -> None:
        c = Controller(ControllerConfig(metadata_dir, host, int(port), users, {credential.username},
                                        session_timeout_ms, producer_id_floor, bootstrap_scram=scram,
                                        ssl_context=tls, limits=limits))
        h, p = await c.start()
        click.echo(f"oncelog: controller listening on {h}:{p}")
        sys.stdout.flush()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await asyncio.wait([asyncio.ensure_future(stop.wait()), asyncio.ensure_future(c.fatal.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        await c.stop()
        if c.fatal.is_set():
            click.echo(f"oncelog: controller stopping: {c.fatal_message}")
            raise SystemExit(2)
    try:
        asyncio.run(run())
    except Exception as e:  # noqa: BLE001 - a start failure is one line (cli/startup.py); others re-raised
        raise startup.failure(e, log_level) from None


oncelog.add_command(perf)
oncelog.add_command(admin)
for _command in operator_commands():
    oncelog.add_command(_command)
oncelog.add_command(verify)


def main() -> None:
    """Errors as one line on stderr, "oncelog: <what went wrong>", with the command's exit code
    (cli/connect.py lists them); click's usage errors too, with where to read the help."""
    try:
        code = oncelog.main(prog_name="oncelog", standalone_mode=False)
    except click.UsageError as e:
        where = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
        click.echo(f"oncelog: {e.format_message().rstrip('.')}{where}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"oncelog: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
