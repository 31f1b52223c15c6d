"""Share-group state (KIP-932's share coordinator and `__share_group_state`, as an equivalent store
behind the same interface): for each share-partition (group, topic id, partition) its state epoch,
its start offset (SPSO) and the state batches above it (`core.share.partition.StateBatch`).

Kafka's persister RPCs map to: InitializeShareGroupState and WriteShareGroupState (`write`, the
first state of a share-partition or a later one), ReadShareGroupState (`read`),
DeleteShareGroupState (`delete`), ReadShareGroupStateSummary (`read_summary`). A write carrying a
state epoch below the stored one is refused (FENCED_STATE_EPOCH in Kafka; `StaleStateEpoch` here):
an old leader of the share-partition cannot overwrite what a newer one wrote.

One append-only log per share group (`<dir>/<group>/share-state.log`), written in group commits:
`write(group, states)` appends one frame per share-partition given (its whole state, the latest
of every change since the previous write: many requests' changes to one share-partition cost one
frame) in one write, without an fsync, and returns a `Pending`; `sync(pending)` fsyncs the file
(from any thread: it touches no state), and `synced` / `sync_failed` tell the store how that
ended. The broker answers nothing a write covers before its fsync returned
(`broker.groups.share_groups`), so one fsync makes the changes of many share-partitions and many
requests durable at once (issue 37: a file per share-partition, replaced and fsynced before each
answer, cost up to 8 fsyncs per ShareFetch). Kafka's share coordinator does the same with
`__share_group_state`: the writes of many requests go into one record batch
(`share.coordinator.append.linger.ms`) and are answered once the batch is committed.

Frames, as `storage.group_records` frames them:
    length  uint32  (bytes of payload)
    crc     uint32  CRC-32C of payload
    payload         UTF-8 JSON {"t": topic id, "p": partition, "e": state epoch, "s": start
                    offset, "b": [[first, last, state, delivery count], ...], and, once the
                    share-partition has dead letters (KIP-1191), "q": {"p": producer id, "e":
                    producer epoch, "t": [dead-letter topic id, partition] or null, "n": next
                    sequence, "l": [[offset, sequence, delivery count, reason], ...]}}, or
                    {"t", "p", "d": 1} when the share-partition's state was deleted
The latest frame of a share-partition is its state (Kafka's ShareSnapshot; there are no deltas
here, so no ShareUpdate). Recovery reads frames up to the first torn or corrupt one (a crash
mid-write: nothing after it was answered); the next write cuts the rest, under the owner's lease.
A failed write or fsync is cut back to what was durable; if the cut fails too, the log refuses
writes until it is read again (`forget`).

Compaction: when the file has grown past twice its live frames (plus a slack), the next write
writes the live frames whole to a new file that replaces the old one (`storage.durable.replace_file`,
durable when it returns: that write needs no `sync`). Each compaction writes what at least as many
appended bytes paid for. A group's first write creates its log the same way, folding in the state
files of the format before it (one JSON file per share-partition, `<topic id>-<partition>.json`),
which are removed once the log is durable; until then they are read as the group's state.

Writes go through `writing(group)`, the group's lease in a cluster (the same fence as the group's
offsets, `storage.group_offsets`), so a paused old owner writes nothing; in a shared directory a
log another broker wrote since this one read it is refused rather than written over.

Group configs (`share.auto.offset.reset` ...) are kept apart (`<dir>/../group-configs/<group>.json`):
a group may have configs before it has any state, and its configs do not make it a share group.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.core.share.partition import DeadLetter, DeadLetterState, StateBatch
from oncelog.storage import failpoints as fp
from oncelog.storage import frames as framing
from oncelog.storage.durable import fsync_dir, replace_file

log = logging.getLogger(__name__)

_FORMAT = 1
LOG_NAME = "share-state.log"
# a log is compacted once it is larger than twice its live frames and this much
COMPACT_SLACK_BYTES = 1 << 20

Key = tuple[uuid.UUID, int]   # (topic id, partition) within a group


class StaleStateEpoch(Exception):
    """A write with a state epoch older than the stored one (Kafka's FENCED_STATE_EPOCH)."""


@dataclass(frozen=True)
class ShareState:
    state_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...]
    dead_letters: DeadLetterState | None = None   # KIP-1191: what it owes its dead-letter topic


@dataclass
class GroupStateLog:
    """One group's log as this process last read or wrote it."""
    path: Path
    states: dict[Key, ShareState] = field(default_factory=dict)   # the latest state of each live key
    frames: dict[Key, bytes] = field(default_factory=dict)        # ... and its frame
    live: int = 0              # bytes of `frames`
    size: int = 0              # bytes of whole frames written (the next write goes here)
    synced: int = 0            # bytes known to be on disk (read at load, or covered by an fsync)
    end: int = 0               # the file's size as last read or written (a torn tail above `size`)
    inode: int = -1            # -1: no log file yet
    generation: int = 0        # moves when the file is replaced (compaction) or its tail cut
    failed: str | None = None  # a failure that could not be cut back: read the log again
    legacy: list[Path] = field(default_factory=list)   # state files of the older format, folded in

    @classmethod
    def read(cls, path: Path) -> GroupStateLog:
        """The log at `path` (a torn or corrupt tail is ignored, cut by the next write), or the
        legacy state files beside it when there is no log yet."""
        out = cls(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            out._read_legacy()
            return out
        pos = 0
        for start, stop, payload in framing.frames(data):
            try:
                key, state = _decode(payload)
            except (ValueError, KeyError, TypeError) as e:
                log.error("%s: a frame at byte %d does not decode (%s); the log ends there", path, start, e)
                break
            out._note(key, data[start:stop], state)
            pos = stop
        if pos < len(data):
            log.warning("%s: %d bytes after the last whole frame (a write the process did not finish) are "
                        "ignored and cut by the next write", path, len(data) - pos)
        out.size = out.synced = pos
        out.end = len(data)
        out.inode = os.stat(path).st_ino
        out.legacy = sorted(path.parent.glob("*.json"))
        return out

    def _read_legacy(self) -> None:
        for p in sorted(self.path.parent.glob("*.json")):
            topic, _, index = p.stem.rpartition("-")
            data = json.loads(p.read_text())
            key = (uuid.UUID(topic), int(index))
            state = ShareState(int(data["state_epoch"]), int(data["start_offset"]), tuple(
                StateBatch(int(f), int(la), int(s), int(c)) for f, la, s, c in data["batches"]))
            self._note(key, _frame(key, state), state)
            self.legacy.append(p)

    def _note(self, key: Key, frame: bytes, state: ShareState | None) -> None:
        old = self.frames.pop(key, None)
        if old is not None:
            self.live -= len(old)
        self.states.pop(key, None)
        if state is not None:
            self.frames[key] = frame
            self.states[key] = state
            self.live += len(frame)

    def due(self, adding: int) -> bool:
        return self.size + adding > 2 * self.live + COMPACT_SLACK_BYTES


@dataclass(frozen=True)
class Pending:
    """A write not yet known to be on disk: `ShareStateStore.sync` it, then say how it ended."""
    log: GroupStateLog
    generation: int
    size: int


class ShareStateStore:
    def __init__(self, directory: str | Path,
                 writing: Callable[[str], AbstractContextManager[object]] | None = None,
                 shared: bool = False) -> None:
        """`shared`: brokers of a cluster share the directory, so a log written by another broker
        since this one read it is refused (its group moved away and back: read it again)."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.configs_dir = self.directory.parent / "group-configs"
        self._writing = writing or (lambda group: nullcontext())
        self.shared = shared
        self._logs: dict[str, GroupStateLog] = {}

    def _group_dir(self, group: str) -> Path:
        return self.directory / urllib.parse.quote(group, safe="")

    def _log(self, group: str) -> GroupStateLog:
        current = self._logs.get(group)
        if current is None or current.failed:
            current = self._logs[group] = GroupStateLog.read(self._group_dir(group) / LOG_NAME)
        return current

    # ------------------------------------------------------------------ Kafka's persister
    def read(self, group: str, topic_id: uuid.UUID, partition: int) -> ShareState | None:
        """ReadShareGroupState: the share-partition's latest state written (durable once the
        write that made it was synced; a loaded log's are)."""
        return self._log(group).states.get((topic_id, partition))

    def read_summary(self, group: str, topic_id: uuid.UUID, partition: int) -> tuple[int, int] | None:
        """ReadShareGroupStateSummary: (state epoch, start offset)."""
        state = self.read(group, topic_id, partition)
        return None if state is None else (state.state_epoch, state.start_offset)

    def write(self, group: str, states: Mapping[Key, ShareState | None]) -> Pending | None:
        """Write the states of these share-partitions of `group` (None: its state is deleted) in
        one write, not fsynced: a `Pending` for `sync`, or None when the write was durable at once
        (a new log, or a compaction). Raises OSError (the fence's `Fenced` among them) or
        StaleStateEpoch with nothing of it left in the file."""
        if not states:
            return None
        with self._writing(group):
            glog = self._log(group)
            if glog.failed:
                raise OSError(f"{glog.path} refuses writes until it is read again: {glog.failed}")
            for key, state in states.items():
                stored = glog.states.get(key)
                if state is not None and stored is not None and state.state_epoch < stored.state_epoch:
                    raise StaleStateEpoch(f"{group} {key[0]}-{key[1]}: state epoch {state.state_epoch} "
                                          f"< stored {stored.state_epoch}")
            frames = [(key, _frame(key, state), state) for key, state in states.items()]
            data = b"".join(f for _k, f, _s in frames)
            if glog.inode < 0 or glog.due(len(data)):
                self._write_whole(group, glog, frames)
                return None
            fd = os.open(glog.path, os.O_WRONLY)
            try:
                if self.shared:
                    st = os.fstat(fd)
                    if st.st_ino != glog.inode or st.st_size != glog.end:
                        del self._logs[group]
                        raise OSError(f"{glog.path} was written by another broker since this one read it")
                try:
                    if glog.end > glog.size:   # a torn tail read at load: cut before appending
                        os.ftruncate(fd, glog.size)
                        glog.end = glog.size
                    written = fp.share_write(fd, data, glog.size)
                    if written != len(data):
                        raise OSError(f"short write: {written} of {len(data)} bytes")
                except OSError as e:
                    _cut_back(glog, fd, glog.size, e)
                    raise
            finally:
                os.close(fd)
            glog.size += len(data)
            glog.end = glog.size
            for key, frame, state in frames:
                glog._note(key, frame, state)
            if glog.legacy:   # left by a crash after the log that folded them in was durable
                self._drop_legacy(group, glog)
            return Pending(glog, glog.generation, glog.size)

    def _write_whole(self, group: str, glog: GroupStateLog, frames: list[tuple[Key, bytes, ShareState | None]]
                     ) -> None:
        """The live frames with these, as a new file (durable when this returns); the state files
        of the older format go once it is."""
        for key, frame, state in frames:
            glog._note(key, frame, state)
        data = b"".join(glog.frames.values())
        grown, new_dir = glog.size, not glog.path.parent.exists()
        if new_dir:
            glog.path.parent.mkdir(parents=True)
            fsync_dir(self.directory)
        replace_file(glog.path, data)
        fp.replaced("share", str(glog.path), len(data))
        glog.size = glog.synced = glog.end = len(data)
        glog.inode = os.stat(glog.path).st_ino
        glog.generation += 1
        if glog.legacy:
            self._drop_legacy(group, glog)
        elif grown:
            log.info("share group %s: state log compacted from %d to %d bytes", group, grown, len(data))

    @staticmethod
    def _drop_legacy(group: str, glog: GroupStateLog) -> None:
        for p in glog.legacy:
            p.unlink(missing_ok=True)
        fsync_dir(glog.path.parent)
        log.info("share group %s: %d share-partition state files folded into %s", group, len(glog.legacy),
                 glog.path.name)
        glog.legacy = []

    @staticmethod
    def sync(pending: Pending) -> None:
        """fsync what `pending` wrote (any thread: it touches no state); OSError when it failed."""
        fd = os.open(pending.log.path, os.O_RDONLY)
        try:
            fp.share_sync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def synced(pending: Pending) -> None:
        """`sync(pending)` returned."""
        glog = pending.log
        if pending.generation == glog.generation:
            glog.synced = max(glog.synced, pending.size)

    @staticmethod
    def sync_failed(pending: Pending, error: OSError) -> None:
        """`sync(pending)` failed: what was not known to be on disk is cut off (its writers are
        told the change was not stored)."""
        glog = pending.log
        if pending.generation != glog.generation or glog.failed:
            return
        try:
            fd = os.open(glog.path, os.O_WRONLY)
        except OSError as e:
            glog.failed = f"a failed fsync ({error}) could not be cut back ({e})"
            return
        try:
            _cut_back(glog, fd, glog.synced, error)
        finally:
            os.close(fd)

    def forget(self, group: str) -> None:
        """What this process knew of the group's log is dropped; the next use reads the file."""
        self._logs.pop(group, None)

    def delete(self, group: str) -> None:
        """DeleteShareGroupState for every share-partition of the group."""
        with self._writing(group):
            self._logs.pop(group, None)
            d = self._group_dir(group)
            if d.exists():
                shutil.rmtree(d)
                fsync_dir(self.directory)

    # ------------------------------------------------------------------ group configs
    def read_configs(self, group: str) -> dict[str, str]:
        """The group's configs (Kafka keeps them in the metadata log as GROUP config records)."""
        try:
            data = json.loads(self._configs_path(group).read_text())
        except FileNotFoundError:
            return {}
        return {str(k): str(v) for k, v in data["configs"].items()}

    def write_configs(self, group: str, configs: dict[str, str]) -> None:
        with self._writing(group):
            if not self.configs_dir.exists():
                self.configs_dir.mkdir(parents=True)
                fsync_dir(self.configs_dir.parent)
            replace_file(self._configs_path(group), json.dumps({"format": _FORMAT, "configs": configs}))

    def _configs_path(self, group: str) -> Path:
        return self.configs_dir / (urllib.parse.quote(group, safe="") + ".json")

    # ------------------------------------------------------------------ listings
    def has_group(self, group: str) -> bool:
        return self._group_dir(group).is_dir()

    def groups(self) -> list[str]:
        return sorted(urllib.parse.unquote(p.name) for p in self.directory.iterdir() if p.is_dir())

    def partitions(self, group: str) -> Iterator[Key]:
        if not self.has_group(group):
            return
        yield from sorted(self._log(group).states, key=lambda k: (str(k[0]), k[1]))


def _cut_back(glog: GroupStateLog, fd: int, size: int, error: OSError) -> None:
    try:
        os.ftruncate(fd, size)
        fp.share_sync(fd)
    except OSError as e:
        glog.failed = f"a failed write ({error}) could not be cut back to {size} bytes ({e})"
        log.critical("%s: %s", glog.path, glog.failed)
        return
    glog.size = glog.end = size
    glog.generation += 1
    log.error("%s: write failed (%s); cut back to %d bytes", glog.path, error, size)


def _frame(key: Key, state: ShareState | None) -> bytes:
    body: dict[str, Any] = {"t": str(key[0]), "p": key[1]}
    if state is None:
        body["d"] = 1
    else:
        body.update(e=state.state_epoch, s=state.start_offset,
                    b=[(b.first_offset, b.last_offset, b.state, b.delivery_count) for b in state.batches])
        dl = state.dead_letters
        if dl is not None and (dl.producer_id >= 0 or dl.pending or dl.next_sequence):
            body["q"] = {"p": dl.producer_id, "e": dl.producer_epoch, "t": list(dl.target) if dl.target else None,
                         "n": dl.next_sequence,
                         "l": [(d.offset, d.sequence, d.delivery_count, d.reason) for d in dl.pending]}
    payload = json.dumps(body, separators=(",", ":")).encode()
    return framing.frame(payload)


def _decode(payload: bytes) -> tuple[Key, ShareState | None]:
    body = json.loads(payload)
    key = (uuid.UUID(body["t"]), int(body["p"]))
    if body.get("d"):
        return key, None
    q = body.get("q")
    dead_letters = None
    if q is not None:
        target = q["t"]
        dead_letters = DeadLetterState(
            int(q["p"]), int(q["e"]), (str(target[0]), int(target[1])) if target else None, int(q["n"]),
            tuple(DeadLetter(int(o), int(seq), int(c), int(r)) for o, seq, c, r in q["l"]))
    return key, ShareState(int(body["e"]), int(body["s"]),
                           tuple(StateBatch(int(f), int(la), int(s), int(c)) for f, la, s, c in body["b"]),
                           dead_letters)
