"""`oncelog`: the command line, and the composition root that wires broker, storage and producer
ids together. Nothing imports this module."""
from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.cli import logs
from oncelog.cli.perf import perf

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
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def serve(properties, overrides, listeners, advertised_listeners, log_dirs, log_level, log_format) -> None:
    """Run a broker (single node, controller in-process). Ctrl-C stops it cleanly."""
    logs.configure(log_level, log_format)
    for name, value in (("listeners", listeners), ("advertised.listeners", advertised_listeners),
                        ("log.dirs", log_dirs)):
        if value is not None:
            overrides[name] = value
    try:
        config = BrokerConfig.load(properties, overrides)
    except (ConfigError, OSError) as e:
        raise click.ClickException(f"bad configuration: {e}") from None
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_serve(config))
    except KeyboardInterrupt:
        pass


async def _serve(config: BrokerConfig) -> None:
    from oncelog.broker.server import Broker
    broker = Broker(config)
    host, port = await broker.start()
    advertised = f"{broker.advertised_host}:{broker.advertised_port}"
    click.echo(f"oncelog: listening on {host}:{port}", err=False)
    click.echo(f"oncelog: clients connect with bootstrap.servers={advertised}"
               + (f"; metrics on http://{config['metrics.host']}:{broker.metrics_port}/metrics"
                  if broker.metrics_port else ""))
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    click.echo("oncelog: shutting down")
    await broker.stop()


oncelog.add_command(perf)


def main() -> None:
    oncelog()


if __name__ == "__main__":
    main()
