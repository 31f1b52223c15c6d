"""The snapshot half of a partition's producer state: which `.pstate` files exist, which one a
start loads, what a failed load sets aside, which ones are kept (Kafka's ProducerStateManager
keeps this beside its in-memory map; here the map is `core.producer_state.ProducerStateManager`,
pure, and the files are this store's, as the model review asked: "keep those apart").

The file format is `storage.producer_snapshots`; the partition decides when a snapshot is due and
what it covers (`storage.partition.Partition.take_snapshot`). A snapshot at offset S promises
that recovery need not read the log below S, so a load tries the newest snapshot at or below the
log end first, sets aside one that does not read or apply (and tries the next older one), and
deletes any beyond the log end (the log was cut below it: its state is ahead of the log).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from oncelog.core.producer_state import ProducerSnapshotColumns
from oncelog.storage import producer_snapshots as snaps

log = logging.getLogger(__name__)

SNAPSHOTS_TO_KEEP = 3


class Loaded(NamedTuple):
    offset: int | None   # the snapshot applied, None when none was (replay from the log start)
    set_aside: int       # unreadable snapshots moved out of the way on the way there


class ProducerStateStore:
    def __init__(self, directory: Path, keep: int = SNAPSHOTS_TO_KEEP) -> None:
        self.directory = Path(directory)
        self.keep = keep

    def write(self, offset: int, cols: ProducerSnapshotColumns, *, sync: bool) -> Path:
        """A snapshot of the state covering the log below `offset`, durable with `sync`
        (`storage.durable`); then all but the newest `keep` at or below it go."""
        path = snaps.write_snapshot(self.directory, offset, cols, sync=sync)
        snaps.remove_stale(self.directory, offset, self.keep)
        return path

    def load(self, log_end: int, apply: Callable[[ProducerSnapshotColumns], None]) -> Loaded:
        """Hand the newest readable snapshot at or below `log_end` to `apply`. A snapshot that
        does not decode, or that `apply` refuses (CorruptSnapshotError or ValueError; `apply`
        leaves no partial state behind), is set aside and the next older one tried."""
        set_aside = 0
        for offset, path in reversed(snaps.list_snapshots(self.directory)):
            if offset > log_end:
                log.info("producer snapshot %s is beyond the log end %d; removed", path.name, log_end)
                snaps.delete_snapshots([path])
                continue
            try:
                _offset, cols = snaps.read_snapshot(path)
                apply(cols)
            except (snaps.CorruptSnapshotError, ValueError) as exc:
                snaps.set_aside(path, str(exc))
                set_aside += 1
                continue
            return Loaded(offset, set_aside)
        return Loaded(None, set_aside)

    def delete_beyond(self, log_end: int) -> None:
        """After the log was cut to `log_end`: snapshots above it describe records it lost."""
        snaps.delete_snapshots(p for offset, p in snaps.list_snapshots(self.directory) if offset > log_end)
