"""The controller's metadata log: append-only records, each fsynced before `append` returns.

File `metadata.log`, one frame per record:
    length  uint32  (bytes of payload)
    crc     uint32  CRC-32C of payload
    payload         UTF-8 JSON object with a "type" field
Record offsets count frames from 0. Snapshots `snapshot-<offset>.json` hold the state that replays
the records below <offset>, wrapped as {"crc": CRC-32C of the canonical state JSON, "state": ...};
written to a temporary file, fsynced, then renamed. The directory and its files are the owner's
alone (0700, 0600): they hold every SCRAM verifier, which other local users must not read.
Recovery loads the newest snapshot whose CRC checks (others are set aside) and replays the
records from its offset. A torn or corrupt tail (a write cut by a crash) is truncated with a
WARNING; nothing after it was ever acknowledged, because a record counts only once its fsync
returned.

A write that fails, comes up short (a full disk) or whose fsync fails is cut off again before
`append` raises MetadataLogError, so the next append starts where the last durable record ended:
no torn record in the middle of the log (recovery would cut everything after it) and no record
written twice (replay would refuse the second copy). If even the cut fails the log refuses every
further append (`failed`) until a restart recovers it.
"""
from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from crc32c import crc32c

from oncelog.storage import failpoints as fp
from oncelog.storage import frames as framing
from oncelog.storage.dir_lock import DirectoryLock
from oncelog.storage.durable import rename, replace_file

log = logging.getLogger(__name__)

LOG_FILE = "metadata.log"


class MetadataLogError(Exception):
    """An append that did not become durable; nothing of it is in the log."""


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


class MetadataLog:
    def __init__(self, directory: str | Path, read_only: bool = False) -> None:
        """`read_only` (audits while a controller runs): read what is complete, change nothing."""
        self.directory = Path(directory)
        self.read_only = read_only
        # one controller per metadata directory: a second one would append records the first
        # never replays (read-only audits take no lock)
        self._lock = None if read_only else DirectoryLock.exclusive(self.directory, "a controller")
        if not read_only:
            os.chmod(self.directory, 0o700)   # also a directory made by an older version
        self.path = self.directory / LOG_FILE
        self._records: list[dict[str, Any]] = []
        self._size = 0  # bytes of whole, durable records
        self.failed: str | None = None
        try:
            self._recover()
            self._fd = -1 if read_only else os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if not read_only:
                os.fchmod(self._fd, 0o600)
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise

    def _recover(self) -> None:
        data = self.path.read_bytes() if self.path.exists() else b""
        pos = 0
        for _start, end, payload in framing.frames(data):
            try:
                self._records.append(json.loads(payload))
            except ValueError:
                break
            pos = end
        self._size = pos
        if pos < len(data) and not self.read_only:
            log.warning("%s: ignoring a torn or corrupt tail of %d bytes at position %d (truncated)",
                        self.path, len(data) - pos, pos)
            with open(self.path, "r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())

    @property
    def end_offset(self) -> int:
        return len(self._records)

    @property
    def is_new(self) -> bool:
        """Nothing was ever written here: no record and no snapshot (`--add-scram` applies now only)."""
        return not self._records and not any(self.directory.glob("snapshot-*.json"))

    def append(self, records: list[dict[str, Any]]) -> int:
        """Write and fsync; returns the offset of the first record. Raises MetadataLogError,
        with nothing of `records` left in the file, when they could not be made durable."""
        if self.failed:
            raise MetadataLogError(f"{self.path} refuses appends until a restart: {self.failed}")
        first = len(self._records)
        if not records:
            return first
        framed = b"".join(framing.frame(_canonical(r)) for r in records)
        try:
            written = fp.meta_write(self._fd, framed)
            if written != len(framed):
                raise OSError(errno.ENOSPC, f"short write: {written} of {len(framed)} bytes")
            fp.meta_sync(self._fd)
        except OSError as e:
            self._cut_back(e)
            raise MetadataLogError(f"{self.path}: append of {len(records)} record(s) failed ({e}); "
                                   "nothing was appended") from None
        self._size += len(framed)
        self._records.extend(records)
        return first

    def _cut_back(self, error: OSError) -> None:
        """Remove whatever the failed append left after the last durable record."""
        try:
            fp.meta_truncate(self._fd, self._size)
            fp.meta_sync(self._fd)
        except OSError as e:
            self.failed = f"a failed append ({error}) could not be cut back to {self._size} bytes ({e})"
            log.critical("%s: %s; refusing appends until a restart recovers the log", self.path, self.failed)
            return
        log.error("%s: append failed (%s); cut back to %d bytes, nothing appended", self.path, error, self._size)

    def read(self, start: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
        for i in range(start, len(self._records)):
            yield i, self._records[i]

    # ------------------------------------------------------------------ snapshots
    def write_snapshot(self, offset: int, state: dict[str, Any]) -> Path:
        path = self.directory / f"snapshot-{offset:020d}.json"
        body = {"crc": crc32c(_canonical(state)), "offset": offset, "state": state}
        replace_file(path, json.dumps(body), mode=0o600)
        for old in sorted(self.directory.glob("snapshot-*.json"))[:-2]:
            old.unlink()
        return path

    def latest_snapshot(self) -> tuple[int, dict[str, Any]] | None:
        for path in sorted(self.directory.glob("snapshot-*.json"), reverse=True):
            try:
                body = json.loads(path.read_text())
                if crc32c(_canonical(body["state"])) != body["crc"] or body["offset"] > self.end_offset:
                    raise ValueError("CRC mismatch" if body.get("offset", 0) <= self.end_offset
                                     else "snapshot beyond the log")
                return body["offset"], body["state"]
            except (ValueError, KeyError, OSError) as e:
                aside = path.with_suffix(".corrupt")
                log.warning("%s: unreadable snapshot (%s), set aside as %s", path, e, aside.name)
                rename(path, aside)
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock is not None:
            self._lock.release()
            self._lock = None
