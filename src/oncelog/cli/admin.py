"""`oncelog admin`: cluster administration through the controller, and audits of its metadata log."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from oncelog.core.producer_ids import BLOCK_SIZE, PID_BLOCK

CLUSTER_FILE = "cluster.json"


@click.group("admin")
def admin() -> None:
    """Administration of a cluster and audits of its metadata."""


def _metadata_dir(data_dir: str | None, metadata_dir: str | None) -> Path:
    if metadata_dir:
        return Path(metadata_dir)
    return Path(data_dir or "./data") / "__cluster_metadata"


@admin.command("pid-blocks")
@click.option("--data-dir", help="The broker's log.dirs (the metadata log is in __cluster_metadata).")
@click.option("--metadata-dir", help="A controller's --metadata-dir.")
def pid_blocks(data_dir, metadata_dir) -> None:
    """Every producer-id block the controller handed out, and to whom (KIP-730's audit)."""
    from oncelog.storage.metadata_log import MetadataLog
    directory = _metadata_dir(data_dir, metadata_dir)
    if not (directory / "metadata.log").exists():
        raise click.ClickException(f"no metadata log in {directory}")
    log = MetadataLog(directory, read_only=True)
    table = Table("record offset", "broker", "broker epoch", "first id", "last id")
    previous = 0
    for offset, r in log.read():
        if r["type"] != PID_BLOCK:
            continue
        nxt = r["next_producer_id"]
        if r["broker_id"] < 0:
            table.add_row(str(offset), "-", "-", "(upgrade floor)", str(nxt - 1))
        else:
            first = max(previous, nxt - BLOCK_SIZE)
            table.add_row(str(offset), str(r["broker_id"]), str(r["broker_epoch"]), str(first), str(nxt - 1))
        previous = nxt
    log.close()
    Console().print(table)


def _controller_client(data_dir, controller, user, password):
    from oncelog.broker.controller_client import ControllerClient
    if controller is None:
        path = Path(data_dir or "./data") / CLUSTER_FILE
        if not path.exists():
            raise click.ClickException(f"no {path}: give --controller, --user and --password")
        info = json.loads(path.read_text())
        controller, user, password = info["controller"], info["username"], info["password"]
    host, _, port = controller.rpartition(":")
    return ControllerClient(host, int(port), user, password, client_id="oncelog-admin")


@admin.command("move-leader")
@click.argument("topic")
@click.argument("partition", type=int)
@click.argument("broker", type=int)
@click.option("--data-dir", help="Data directory of `oncelog serve --brokers N` (reads cluster.json).")
@click.option("--controller", help="host:port of the controller listener.")
@click.option("--user", help="SASL/PLAIN user with cluster rights.")
@click.option("--password", help="Its password.")
def move_leader(topic, partition, broker, data_dir, controller, user, password) -> None:
    """Make BROKER the leader of TOPIC's PARTITION (a new leader epoch fences the old leader)."""

    async def run():
        client = _controller_client(data_dir, controller, user, password)
        try:
            return await client.move_leader(topic, partition, broker)
        finally:
            client.close()
    code, message = asyncio.run(run())
    if code:
        raise click.ClickException(f"move refused: error {code}: {message}")
    click.echo(f"{topic}-{partition}: leader is now broker {broker}")
