"""Power-loss emulation: leave a data directory as a power cut would, from the fsync ledger.

A kill -9 loses nothing the kernel holds: the page cache survives the process. A power cut loses
what no fsync covered. Brokers and controllers started with the storage failpoint `ledger`
(ONCELOG_FAILPOINTS containing `ledger:any`, see `LEDGER`) append "<file> <size>" to a `.fsynced`
file beside each partition segment, metadata log, share group state log and group record log
(`storage.group_records`) after every successful fsync. With every process killed,
`lose_unsynced(root)` truncates each of those files to its last fsynced size (a file with no entry
never had an fsync: it is emptied), which is the worst a power cut can do to them. What power loss
does to files written by replace-and-rename (registries, checkpoints, snapshots) is not emulated
here: they all go through `storage.durable`, which fsyncs the file before the rename and the
directory after it, and `tests/storage/test_durable.py` checks each writer's system calls against
what a power cut keeps.

    broker = BrokerProcess(data, env={"ONCELOG_FAILPOINTS": LEDGER}).start()
    ... produce ...
    broker.kill()
    lose_unsynced(data)
    broker.start()      # every record acknowledged as durable must still be there
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from oncelog.storage.failpoints import LEDGER as LEDGER_FILE
from oncelog.storage.failpoints import read_ledger

LEDGER = "ledger:any"  # the failpoint rule that keeps the ledger
# what the ledger covers: segments, the metadata log, share-state logs, the groups' record logs
_TRACKED = re.compile(r"^(\d{20}\.log|metadata\.log|share-state\.log|[^/]+\.records|[^/]+\.offsets)$")
_GROUP_LOG = re.compile(r"^[^/]+\.(records|offsets)$")


class NoLedgerError(RuntimeError):
    """A directory with segments but no ledger: the process ran without the `ledger` failpoint."""


@dataclass(frozen=True)
class Cut:
    path: Path
    size: int   # before the power cut
    kept: int   # what an fsync covered

    @property
    def lost(self) -> int:
        return self.size - self.kept


def lose_unsynced(root: str | os.PathLike) -> list[Cut]:
    """Truncate every tracked file under `root` to its last fsynced size; returns what was cut.
    Only for directories of processes that are not running."""
    cuts = []
    for directory, _dirs, files in os.walk(os.fspath(root)):
        tracked = [f for f in files if _TRACKED.match(f)]
        if not tracked:
            continue
        # a group record log may be created and written without any fsync yet (its first one
        # would have made the ledger): only the other kinds say the ledger is missing
        if LEDGER_FILE not in files and not all(_GROUP_LOG.match(f) for f in tracked):
            raise NoLedgerError(f"{directory} has {', '.join(sorted(tracked))} but no {LEDGER_FILE}: start "
                                f"the process with ONCELOG_FAILPOINTS={LEDGER} to emulate a power loss")
        synced = read_ledger(directory)
        for name in tracked:
            path = Path(directory) / name
            size, kept = path.stat().st_size, synced.get(name, 0)
            if size > kept:
                os.truncate(path, kept)
                cuts.append(Cut(path, size, kept))
    return cuts


def with_ledger(spec: str | None) -> str:
    """A failpoint spec that also keeps the ledger."""
    return f"{spec},{LEDGER}" if spec else LEDGER
