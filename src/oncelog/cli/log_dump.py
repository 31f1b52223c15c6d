"""`oncelog log dump`: segment files read directly (kafka-dump-log), no broker needed: each batch
with its offsets, producer id, epoch and sequences, flags and transaction markers; `--verify`
checks CRCs, offsets and the index of a stopped broker's segments (storage/segment_dump.py)."""
from __future__ import annotations

from pathlib import Path

import click

from oncelog.cli.connect import REFUSED, CommandError, interactive, print_json


@click.group("log")
def log_group() -> None:
    """Read segment files directly (no broker needed)."""


def _segments(paths: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():   # a partition directory: its segments in offset order
            out += sorted(p.glob("*.log"))
        else:
            out.append(p)
    return out


def _line(b) -> str:
    text = (f"baseOffset: {b.base_offset} lastOffset: {b.last_offset} count: {b.count} "
            f"baseSequence: {b.base_sequence} lastSequence: {b.last_sequence} producerId: {b.producer_id} "
            f"producerEpoch: {b.producer_epoch} partitionLeaderEpoch: {b.partition_leader_epoch} "
            f"isTransactional: {str(b.transactional).lower()} isControl: {str(b.control).lower()} "
            f"position: {b.position} {b.timestamp_type}: {b.max_timestamp} size: {b.size} magic: {b.magic} "
            f"compresscodec: {b.compression} crc: {b.crc} isvalid: {str(b.crc_valid).lower()}")
    if b.marker:
        text += f"\n| endTxnMarker: {b.marker} coordinatorEpoch: {b.coordinator_epoch}"
    return text


def _records(data: bytes, b) -> list[dict]:
    from oncelog.protocol.records import decode_batch
    out = []
    for r in decode_batch(memoryview(data)[b.position:b.position + b.size]):
        out.append({"offset": r.offset, "timestamp": r.timestamp,
                    "key": None if r.key is None else r.key.decode(errors="backslashreplace"),
                    "value": None if r.value is None else r.value.decode(errors="backslashreplace"),
                    "headers": [[k, None if v is None else v.decode(errors="backslashreplace")] for k, v in r.headers]})
    return out


@log_group.command("dump")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--verify", is_flag=True, help="Check CRCs, offsets and the index; exit 1 if anything is wrong.")
@click.option("--records", "with_records", is_flag=True, help="Also print each record (kafka-dump-log's "
              "--print-data-log).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def dump(files, verify, with_records, fmt) -> None:
    """Print the batches of segment FILES (.log files, or partition directories)."""
    from oncelog.storage import segment_dump as sd
    reports, problems_total = [], 0
    for path in _segments(files):
        try:
            data = sd.read_segment(path)
            sd.check_is_segment(path, data)
        except sd.NotASegment as e:
            raise CommandError(str(e), REFUSED) from None
        infos = list(_with_progress(sd.batches(data), len(data), path.name, verify))
        problems = sd.verify(path, data, infos) if verify else []
        problems_total += len(problems)
        if fmt == "json":
            reports.append({"file": str(path), "batches": [
                {**b.as_dict(), **({"records": _records(data, b)} if with_records and b.crc_valid else {})}
                for b in infos], "problems": [{"position": p.position, "message": p.message} for p in problems]})
            continue
        click.echo(f"Dumping {path}")
        if sd.base_offset_of(path) is not None:
            click.echo(f"Starting offset: {sd.base_offset_of(path)}")
        for b in infos:
            click.echo(_line(b))
            if with_records and b.crc_valid and not b.control:
                for r in _records(data, b):
                    click.echo(f"| offset: {r['offset']} CreateTime: {r['timestamp']} key: {r['key']} "
                               f"payload: {r['value']}")
        for p in problems:
            click.echo(f"PROBLEM at position {p.position}: {p.message}")
        if verify:
            click.echo(f"{path}: {len(infos)} batches, " + (f"{len(problems)} problems" if problems else "verified"))
    if fmt == "json":
        print_json(reports)
    if problems_total:
        raise CommandError(f"{problems_total} problems found", REFUSED)


def _with_progress(items, total_bytes: int, name: str, show: bool):
    """Batches as they are read, with a progress bar on a terminal for a long verify."""
    if not (show and interactive() and total_bytes > 64 << 20):
        yield from items
        return
    from rich.progress import Progress
    with Progress(transient=True) as progress:
        task = progress.add_task(f"reading {name}", total=total_bytes)
        for b in items:
            progress.update(task, completed=b.position + b.size)
            yield b
