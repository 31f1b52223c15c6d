"""Committed consumer-group offsets: one small JSON file per group, replaced atomically and
fsynced before the commit is acknowledged (a crash never loses or half-writes a commit).

Beside the offsets, a file keeps what offset retention (`offsets.retention.minutes`) needs to
survive a restart, as Kafka keeps it in its group metadata record: each offset's commit time (and
an explicit expiry from OffsetCommit v2-v4), the group's protocol type, and since when the group
has been empty. Files written before these existed (a bare list of offsets) still load; their
offsets count as committed when the broker started.
"""
from __future__ import annotations

import fcntl
import json
import os
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

_FORMAT = 2


class Committed(NamedTuple):
    offset: int
    metadata: str | None
    leader_epoch: int = -1
    commit_timestamp: int = -1   # ms since the epoch; -1: unknown (an older file)
    expire_timestamp: int = -1   # ms; set by OffsetCommit v2-v4's retention time, else -1


@dataclass(frozen=True)
class GroupMeta:
    protocol_type: str | None = None   # None: offsets only (a consumer using assign), no members ever
    empty_since_ms: int | None = None  # when the group last became empty; None: it has members


class GroupOffsetStore:
    def __init__(self, directory: str | Path, shared: bool = False) -> None:
        """`shared`: brokers of a cluster share the directory and a group's coordinator can move,
        so every read goes to the file (never a cached copy another broker may have replaced)."""
        self.shared = shared
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._groups: dict[str, tuple[dict[tuple[str, int], Committed], GroupMeta]] = {}
        for path in self.directory.glob("*.json"):
            group = urllib.parse.unquote(path.stem)
            self._groups[group] = _read(path)
        # Transactional offsets (TxnOffsetCommit) waiting for their transaction's marker: producer
        # id -> group -> offsets, one fsynced file per producer id, so a commit marker that
        # arrives after a restart still finds them (docs/transactions.md section 4).
        self.pending_dir = self.directory / "txn-offsets"
        self.pending_dir.mkdir(exist_ok=True)
        self._pending: dict[int, dict[str, dict[tuple[str, int], Committed]]] = {}
        self._lock_depth = 0
        for path in self.pending_dir.glob("*.json"):
            self._pending[int(path.stem)] = _read_pending(path)

    def groups(self) -> list[str]:
        if self.shared:
            return [urllib.parse.unquote(p.stem) for p in self.directory.glob("*.json")]
        return list(self._groups)

    def _entry(self, group: str) -> tuple[dict[tuple[str, int], Committed], GroupMeta]:
        if self.shared:
            self._groups.pop(group, None)
            path = self._path(group)
            if path.exists():
                self._groups[group] = _read(path)
        return self._groups.get(group, ({}, GroupMeta()))

    def get(self, group: str) -> dict[tuple[str, int], Committed]:
        return self._entry(group)[0]

    def meta(self, group: str) -> GroupMeta:
        return self._entry(group)[1]

    def _path(self, group: str) -> Path:
        return self.directory / (urllib.parse.quote(group, safe="") + ".json")

    def commit(self, group: str, offsets: dict[tuple[str, int], Committed],
               meta: GroupMeta | None = None) -> None:
        with self.locked():
            self._commit(group, offsets, meta)

    def _commit(self, group: str, offsets: dict[tuple[str, int], Committed],
                meta: GroupMeta | None = None) -> None:
        current, old_meta = self._entry(group)
        self._write(group, {**current, **offsets}, meta if meta is not None else old_meta)

    def set_meta(self, group: str, meta: GroupMeta) -> None:
        """Only a group with offsets has a file: without offsets there is nothing to retain."""
        offsets, old = self._entry(group)
        if offsets and meta != old:
            self._write(group, offsets, meta)

    def remove(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        """Forget some offsets of a group (all of them when `partitions` is None)."""
        offsets, meta = self._entry(group)
        gone = None if partitions is None else set(partitions)
        kept = {} if gone is None else {k: v for k, v in offsets.items() if k not in gone}
        if kept:
            self._write(group, kept, meta)
            return
        self._groups.pop(group, None)
        try:
            self._path(group).unlink()
        except FileNotFoundError:
            pass

    def delete_topic(self, topic: str) -> None:
        for group in self.groups():
            gone = [k for k in self.get(group) if k[0] == topic]
            if gone:
                self.remove(group, gone)

    # ------------------------------------------------------------ transactional offsets
    def pending(self) -> dict[int, dict[str, dict[tuple[str, int], Committed]]]:
        """producer id -> group -> offsets not yet made visible (read-only view). Shared: read
        from the files, where the marker of a transaction coordinated by another broker may have
        committed or dropped them."""
        if self.shared:
            self._pending = {}
            for path in self.pending_dir.glob("*.json"):
                self._reload_pending(int(path.stem))
        return self._pending

    def _reload_pending(self, producer_id: int) -> None:
        try:
            self._pending[producer_id] = _read_pending(self.pending_dir / f"{producer_id}.json")
        except FileNotFoundError:
            self._pending.pop(producer_id, None)

    def pending_of(self, producer_id: int) -> dict[str, dict[tuple[str, int], Committed]]:
        """One producer's pending offsets, group -> offsets (from its file when shared)."""
        if self.shared:
            self._reload_pending(producer_id)
        return self._pending.get(producer_id, {})

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Shared: one broker at a time reads and replaces a file (a group's offsets are written by
        its coordinator and by the brokers applying transaction markers). Re-entrant."""
        if not self.shared or self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_depth += 1
            yield
        finally:
            self._lock_depth -= 1
            os.close(fd)

    def add_pending(self, producer_id: int, group: str, offsets: dict[tuple[str, int], Committed]) -> None:
        """Durable (fsynced) before it returns: the TxnOffsetCommit is answered after this."""
        with self.locked():
            self._add_pending(producer_id, group, offsets)

    def _add_pending(self, producer_id: int, group: str, offsets: dict[tuple[str, int], Committed]) -> None:
        groups = {g: dict(o) for g, o in self.pending_of(producer_id).items()}
        groups[group] = {**groups.get(group, {}), **offsets}
        _write_json(self.pending_dir / f"{producer_id}.json",
                    {g: _offsets_json(o) for g, o in sorted(groups.items())})
        self._pending[producer_id] = groups

    def drop_pending(self, producer_id: int, groups: Iterable[str]) -> None:
        """Forget these groups' pending offsets of `producer_id` (after they were committed, or on
        abort); the file goes last, so a marker repeated after a crash finds what is left."""
        with self.locked():
            self._drop_pending(producer_id, groups)

    def _drop_pending(self, producer_id: int, groups: Iterable[str]) -> None:
        current = self.pending_of(producer_id)
        if not current:
            return
        kept = {g: o for g, o in current.items() if g not in set(groups)}
        path = self.pending_dir / f"{producer_id}.json"
        if kept:
            _write_json(path, {g: _offsets_json(o) for g, o in sorted(kept.items())})
            self._pending[producer_id] = kept
        else:
            del self._pending[producer_id]
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def _write(self, group: str, offsets: dict[tuple[str, int], Committed], meta: GroupMeta) -> None:
        data = {"format": _FORMAT, "protocol_type": meta.protocol_type,
                "empty_since_ms": meta.empty_since_ms,
                "offsets": _offsets_json(offsets)}
        _write_json(self._path(group), data)
        self._groups[group] = (offsets, meta)


def _offsets_json(offsets: dict[tuple[str, int], Committed]) -> list[dict[str, Any]]:
    """A group's offsets as stored, committed or pending alike (read back by `_offsets_from_json`)."""
    return [{"topic": t, "partition": p, "offset": c.offset, "metadata": c.metadata,
             "leader_epoch": c.leader_epoch, "commit_timestamp": c.commit_timestamp,
             "expire_timestamp": c.expire_timestamp}
            for (t, p), c in sorted(offsets.items())]


def _offsets_from_json(entries: list[dict[str, Any]]) -> dict[tuple[str, int], Committed]:
    return {(e["topic"], e["partition"]): Committed(
        e["offset"], e.get("metadata"), e.get("leader_epoch", -1), e.get("commit_timestamp", -1),
        e.get("expire_timestamp", -1)) for e in entries}


def _write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON, durably (written, fsynced, then renamed over it)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_pending(path: Path) -> dict[str, dict[tuple[str, int], Committed]]:
    return {group: _offsets_from_json(entries) for group, entries in json.loads(path.read_text()).items()}


def _read(path: Path) -> tuple[dict[tuple[str, int], Committed], GroupMeta]:
    data = json.loads(path.read_text())
    if isinstance(data, list):  # format 1: the offsets alone
        entries, meta = data, GroupMeta()
    else:
        entries = data["offsets"]
        meta = GroupMeta(data.get("protocol_type"), data.get("empty_since_ms"))
    return _offsets_from_json(entries), meta
