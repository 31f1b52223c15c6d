"""`oncelog admin`: cluster administration through the controller, and audits of its metadata log."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from oncelog.core.controller_state import BLOCK_SIZE, PID_BLOCK

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
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: a table; json: a list of {record_offset, broker_id, broker_epoch, first_id, last_id} "
              "(broker_id null for the upgrade floor).")
def pid_blocks(data_dir, metadata_dir, fmt) -> None:
    """Every producer-id block the controller handed out, and to whom (KIP-730's audit)."""
    from oncelog.storage.metadata_log import MetadataLog
    directory = _metadata_dir(data_dir, metadata_dir)
    if not (directory / "metadata.log").exists():
        raise click.ClickException(f"no metadata log in {directory}")
    log = MetadataLog(directory, read_only=True)
    rows = []
    previous = 0
    for offset, r in log.read():
        if r["type"] != PID_BLOCK:
            continue
        nxt = r["next_producer_id"]
        if r["broker_id"] < 0:   # the upgrade floor: every id below it was issued before
            rows.append({"record_offset": offset, "broker_id": None, "broker_epoch": None, "first_id": None,
                         "last_id": nxt - 1})
        else:
            rows.append({"record_offset": offset, "broker_id": r["broker_id"], "broker_epoch": r["broker_epoch"],
                         "first_id": max(previous, nxt - BLOCK_SIZE), "last_id": nxt - 1})
        previous = nxt
    log.close()
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("record offset", "broker", "broker epoch", "first id", "last id")
    for row in rows:
        if row["broker_id"] is None:
            table.add_row(str(row["record_offset"]), "-", "-", "(upgrade floor)", str(row["last_id"]))
        else:
            table.add_row(*(str(row[k]) for k in ("record_offset", "broker_id", "broker_epoch", "first_id",
                                                  "last_id")))
    Console().print(table)


def _controller_client(data_dir, controller, credential_file):
    """The controller of `serve --brokers N` in `data_dir` (its cluster.json and cluster.credential),
    or the one at `controller`, logged in with the credential in `credential_file`."""
    from oncelog.broker.cluster.controller_client import ControllerClient
    from oncelog.storage import cluster_credential
    data = Path(data_dir or "./data")
    if controller is None:
        path = data / CLUSTER_FILE
        if not path.exists():
            raise click.ClickException(f"no {path}: give --controller and --credential-file")
        controller = json.loads(path.read_text())["controller"]
    try:
        credential = cluster_credential.load(credential_file or cluster_credential.path_in(data))
    except cluster_credential.CredentialFileError as e:
        raise click.ClickException(str(e)) from None
    host, _, port = controller.rpartition(":")
    return ControllerClient(host, int(port), credential.username, credential.password, client_id="oncelog-admin")


@admin.command("move-leader")
@click.argument("topic")
@click.argument("partition", type=int)
@click.argument("broker", type=int)
@click.option("--data-dir", help="Data directory of `oncelog serve --brokers N` (reads cluster.json and "
              "cluster.credential).")
@click.option("--controller", help="host:port of the controller listener.")
@click.option("--credential-file", type=click.Path(dir_okay=False),
              help="The cluster credential to log in with (JSON username/password, mode 0600; default: the "
              "data directory's cluster.credential).")
def move_leader(topic, partition, broker, data_dir, controller, credential_file) -> None:
    """Make BROKER the leader of TOPIC's PARTITION (a new leader epoch fences the old leader)."""

    async def run():
        client = _controller_client(data_dir, controller, credential_file)
        try:
            return await client.move_leader(topic, partition, broker)
        finally:
            client.close()
    code, message = asyncio.run(run())
    if code:
        raise click.ClickException(f"move refused: error {code}: {message}")
    click.echo(f"{topic}-{partition}: leader is now broker {broker}")
