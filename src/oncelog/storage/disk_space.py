"""Free space of the data directories, and the reserve client records may not use.

Redpanda's `storage_min_free_bytes` semantics, under Kafka's dotted naming
(`storage.min.free.bytes`): once a data directory's filesystem has less free space than the
reserve, Produce to its partitions is refused with KAFKA_STORAGE_ERROR (retriable: producers keep
trying and succeed once space returns), while what the broker must still write there goes on:
offset commits, transaction markers, group and transaction state, producer-state snapshots and
the controller's metadata log. A full disk would fail those too, and an application that cannot
commit what it consumed re-reads it.

Free space is read with statvfs at most every `max_age_s` per directory (Produce asks per
partition and request), and at once after a write failed."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from oncelog.core.log_limit import LogLimit, held_back

log = logging.getLogger("oncelog.storage")


class Usage(NamedTuple):
    free: int      # bytes an unprivileged writer may still use (f_bavail)
    total: int


class DiskSpace:
    def __init__(self, directories: Iterable[str | Path], min_free_bytes: int, max_age_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # longest first: a partition directory belongs to the data directory its path starts with
        self.directories = sorted((Path(d).resolve() for d in directories), key=lambda p: -len(str(p)))
        self.min_free_bytes = min_free_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._read: dict[Path, tuple[float, Usage]] = {}
        # a partition directory's data directory, found once: resolving a path is a few system
        # calls, and Produce asks for every partition of every request
        self._owner: dict[str, Path | None] = {}
        self._refusals = LogLimit(burst=3, period_s=60.0)

    def usage(self, directory: Path) -> Usage:
        now = self._clock()
        seen = self._read.get(directory)
        if seen is not None and now - seen[0] < self.max_age_s:
            return seen[1]
        try:
            st = os.statvfs(directory)
            usage = Usage(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)
        except OSError:
            usage = Usage(-1, -1)   # unknown (the directory is gone): never a reason to refuse
        self._read[directory] = (now, usage)
        return usage

    def data_directory(self, path: str | Path) -> Path | None:
        key = str(path)
        if key in self._owner:
            return self._owner[key]
        p = Path(path).resolve()
        found = next((d for d in self.directories if p.is_relative_to(d)), None)
        if len(self._owner) >= 100_000:   # bounded: topics come and go
            self._owner.clear()
        self._owner[key] = found
        return found

    def produce_refusal(self, partition_directory: str | Path) -> str | None:
        """Why client records may not be appended to this partition now, or None."""
        if self.min_free_bytes <= 0:
            return None
        d = self.data_directory(partition_directory)
        if d is None:
            return None
        free = self.usage(d).free
        if 0 <= free < self.min_free_bytes:
            why = (f"{d} has {free} bytes free, below storage.min.free.bytes={self.min_free_bytes}: "
                   "produce refused until space is freed (the reserve keeps offset commits, markers and "
                   "snapshots writable)")
            write, held = self._refusals.allow(self._clock())
            if write:
                log.warning("%s%s", why, held_back(held, self._refusals.period_s))
            return why
        return None

    def forget(self) -> None:
        """Read again at the next question (a write just failed, or space was freed)."""
        self._read.clear()

    def all_usage(self) -> dict[Path, Usage]:
        """Every data directory's usage, read now (the metrics gauges)."""
        self.forget()
        return {d: self.usage(d) for d in self.directories}
