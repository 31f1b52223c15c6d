"""A KIP-848 consumer group's records, append-only: one file per group (`<group>.records` beside
the group's offsets file), to which each change writes only the records of what changed, as Kafka
appends only the changed records to `__consumer_offsets` (issue 36, finding 2: every heartbeat
rewrote the whole group, 1 MB and an fsync per join at 1,250 members).

Records are Kafka's, keyed as Kafka keys them, the latest value per key winning and a null value a
tombstone: the group epoch (Kafka's type 3), the subscribed topics' metadata (4), a member's
metadata with its current assignment (5 and 8 in one record), the target assignment epoch (6), a
member's target (7), a regex's resolution (16).

One frame per record, as the controller's metadata log frames them:
    length  uint32  (bytes of payload)
    crc     uint32  CRC-32C of payload
    payload         UTF-8 JSON {"k": kind, "id": key within the group or absent, "v": value or null}
An append is fsynced before it returns (the heartbeat is answered after); a failed write or fsync
is cut back so that the file ends where the last durable append ended, and if the cut fails too
the log refuses appends until the group is loaded again. Recovery reads frames up to the first
torn or corrupt one (a crash mid-append: nothing after it was acknowledged); the rest is cut by
the next append, under the owner's lease (a reader writes nothing).

Compaction: the store keeps the latest frame of every live key, so when the file has grown past
twice the live records (plus a slack), the live frames are written whole to a new file that
replaces the old one (`storage.durable.replace_file`). Each compaction writes what at least as
many appended bytes paid for, so appends stay proportional to the change, not to the group.
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.core.groups.consumer_group import Changes, ConsumerGroupRecord, Member
from oncelog.core.groups.reconciliation import Assignment, MemberState
from oncelog.storage import frames as framing
from oncelog.storage.durable import replace_file

log = logging.getLogger(__name__)

SUFFIX = ".records"
# a log is compacted once it is larger than twice its live records and this much
COMPACT_SLACK_BYTES = 256 << 10

Key = tuple[str, str]


@dataclass
class RecordLog:
    """One group's record file as this process last wrote or read it."""
    path: Path
    size: int = 0                                   # bytes of whole, durable frames
    inode: int = -1
    latest: dict[Key, bytes] = field(default_factory=dict)   # live key -> its latest frame
    live: int = 0                                   # bytes of `latest`
    failed: str | None = None
    writes: int = 0                                 # bytes appended (compactions not counted)
    synced: int = 0                                 # bytes known to be on disk
    end: int = 0                                    # the file's size as last read or written
    generation: int = 0                             # moves when the file is replaced (compaction)

    @classmethod
    def read(cls, path: Path) -> tuple[RecordLog, ConsumerGroupRecord | None]:
        """The log at `path` recovered (a torn tail cut), and the group its records make (None:
        no file, or no group epoch record)."""
        data = path.read_bytes()
        out = cls(path)
        values: dict[Key, Any] = {}
        pos = 0
        for start, end, payload in framing.frames(data):
            try:
                record = json.loads(payload)
                key = (record["k"], record.get("id", ""))
            except (ValueError, KeyError, TypeError):
                break
            out._note(key, data[start:end], record["v"] is None)
            if record["v"] is None:
                values.pop(key, None)
            else:
                values[key] = record["v"]
            pos = end
        if pos < len(data):
            # cut by the first append, under the owner's lease: a reader never writes (in a
            # cluster the reader may have just lost the group to a broker appending to it)
            log.warning("%s: ignoring a torn or corrupt tail of %d bytes at position %d (cut at the next append)",
                        path, len(data) - pos, pos)
        out.size = out.synced = pos
        out.end = len(data)
        out.inode = os.stat(path).st_ino
        return out, group_from(values)

    def _note(self, key: Key, frame: bytes, tombstone: bool) -> None:
        old = self.latest.pop(key, None)
        if old is not None:
            self.live -= len(old)
        if not tombstone:
            self.latest[key] = frame
            self.live += len(frame)

    def append(self, records: Iterable[tuple[Key, Any]], shared: bool, sync: bool = True) -> int:
        """Append and fsync the records ((key, value or None)); the bytes appended. Raises
        OSError with nothing of them left in the file when they could not be written (or made
        durable). `shared`: other brokers may have written the file since (ownership moved away
        and back), which is refused rather than written over. `sync=False`: written, not yet
        fsynced; the caller answers nobody before `fsync` covered it (`unsynced`, `synced_to`)."""
        if self.failed:
            raise OSError(f"{self.path} refuses appends until the group is loaded again: {self.failed}")
        frames = [(key, _frame(key, value), value is None) for key, value in records]
        data = b"".join(f for _k, f, _t in frames)
        if not data:
            return 0
        fd = os.open(self.path, os.O_WRONLY)
        try:
            if shared:
                st = os.fstat(fd)
                if st.st_ino != self.inode or st.st_size != self.end:
                    raise OSError(f"{self.path} was written by another broker since this one read it")
            try:
                if self.end > self.size:     # a torn tail read at load: cut before appending
                    os.ftruncate(fd, self.size)
                    self.end = self.size
                written = os.pwrite(fd, data, self.size)
                if written != len(data):
                    raise OSError(f"short write: {written} of {len(data)} bytes")
                if sync:
                    os.fsync(fd)
            except OSError as e:
                self._cut_back(fd, self.size, e)
                raise
        finally:
            os.close(fd)
        self.size += len(data)
        self.end = self.size
        if sync:
            self.synced = self.size
        self.writes += len(data)
        for key, frame, tombstone in frames:
            self._note(key, frame, tombstone)
        return len(data)

    def unsynced(self) -> tuple[Path, int, int] | None:
        """(path, generation, size) to fsync when bytes were written that are not yet known to
        be on disk."""
        return None if self.synced >= self.size else (self.path, self.generation, self.size)

    @staticmethod
    def fsync(path: Path) -> None:
        """fsync the file (any thread: it touches no state)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def synced_to(self, generation: int, size: int) -> None:
        """An `fsync` begun when the file had `size` bytes returned."""
        if generation == self.generation:
            self.synced = max(self.synced, size)

    def sync_failed(self, generation: int, error: OSError) -> None:
        """An `fsync` failed: what was not known to be on disk is cut off (its writers are told
        the change was not stored, and the group is read again from the file)."""
        if generation != self.generation or self.failed:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY)
        except OSError as e:
            self.failed = f"a failed fsync ({error}) could not be cut back ({e})"
            return
        try:
            self._cut_back(fd, self.synced, error)
        finally:
            os.close(fd)
        self.size = self.end = self.synced
        self.failed = self.failed or f"a failed fsync ({error}): the group must be read again"

    def _cut_back(self, fd: int, size: int, error: OSError) -> None:
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError as e:
            self.failed = f"a failed append ({error}) could not be cut back to {size} bytes ({e})"
            log.critical("%s: %s", self.path, self.failed)
            return
        self.end = size
        log.error("%s: append failed (%s); cut back to %d bytes", self.path, error, size)

    def due(self) -> bool:
        return self.size > 2 * self.live + COMPACT_SLACK_BYTES

    def compact(self) -> None:
        """The live records alone, in a new file replacing this one."""
        self.write_whole(list(self.latest.items()))

    def write_whole(self, frames: list[tuple[Key, bytes]]) -> None:
        data = b"".join(f for _k, f in frames)
        replace_file(self.path, data)
        self.latest = dict(frames)
        self.live = self.size = self.synced = self.end = len(data)
        self.inode = os.stat(self.path).st_ino
        self.generation += 1
        self.failed = None

    @classmethod
    def create(cls, path: Path, record: ConsumerGroupRecord) -> RecordLog:
        """A new log holding the whole group (a new group's file, or one converted from the
        whole-file format)."""
        out = cls(path)
        out.write_whole([(key, _frame(key, value)) for key, value in records_of(record)])
        return out


def _frame(key: Key, value: Any) -> bytes:
    body: dict[str, Any] = {"k": key[0]}
    if key[1]:
        body["id"] = key[1]
    body["v"] = value
    payload = json.dumps(body, separators=(",", ":")).encode()
    return framing.frame(payload)


# ---------------------------------------------------------------------- records <-> the group
def changed_records(c: Changes) -> list[tuple[Key, Any]]:
    """The records of a change, tombstones in Kafka's order (current assignment, target, member:
    here the current assignment is in the member's record)."""
    out: list[tuple[Key, Any]] = []
    if c.group_epoch is not None:
        out.append((("epoch", ""), c.group_epoch))
    if c.subscribed_topics is not None:
        out.append((("topics", ""), _topics_json(c.subscribed_topics)))
    for regex, topics in sorted(c.regexes.items()):
        out.append((("regex", regex), None if topics is None else sorted(topics)))
    for mid, a in sorted(c.targets.items()):
        out.append((("target", mid), None if a is None else assignment_json(a)))
    if c.assignment_epoch is not None:
        out.append((("assignment_epoch", ""), c.assignment_epoch))
    for mid, m in sorted(c.members.items()):
        out.append((("member", mid), None if m is None else member_json(m)))
    return out


def records_of(r: ConsumerGroupRecord) -> list[tuple[Key, Any]]:
    """Every record of a whole group."""
    return changed_records(Changes(
        {m.member_id: m for m in r.members}, dict(r.target), r.group_epoch, r.assignment_epoch,
        {n: (tid, p) for n, tid, p in r.subscribed_topics}, dict(r.regex_topics)))


def group_from(values: Mapping[Key, Any]) -> ConsumerGroupRecord | None:
    """The group the latest value of each key makes (None without a group epoch record)."""
    if ("epoch", "") not in values:
        return None
    members = tuple(member_from_json(v) for (k, _id), v in sorted(values.items()) if k == "member")
    return ConsumerGroupRecord(
        values[("epoch", "")], values.get(("assignment_epoch", ""), 0), members,
        tuple((mid, assignment_from_json(v)) for (k, mid), v in sorted(values.items()) if k == "target"),
        tuple((t["name"], uuid.UUID(t["topic_id"]), t["partitions"]) for t in values.get(("topics", ""), ())),
        tuple((rx, frozenset(v)) for (k, rx), v in sorted(values.items()) if k == "regex"))


def _topics_json(topics: Mapping[str, tuple[uuid.UUID, int]]) -> list[dict[str, Any]]:
    return [{"name": n, "topic_id": str(tid), "partitions": p} for n, (tid, p) in sorted(topics.items())]


def assignment_json(a: Assignment) -> list[dict[str, Any]]:
    return [{"topic_id": str(tid), "partitions": sorted(ps)} for tid, ps in sorted(a.items()) if ps]


def assignment_from_json(entries: list[dict[str, Any]]) -> dict[uuid.UUID, frozenset[int]]:
    return {uuid.UUID(e["topic_id"]): frozenset(e["partitions"]) for e in entries}


def member_json(m: Member) -> dict[str, Any]:
    return {"member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
            "client_id": m.client_id, "client_host": m.client_host,
            "subscribed_topic_names": list(m.subscribed_topic_names),
            "subscribed_topic_regex": m.subscribed_topic_regex,
            "rebalance_timeout_ms": m.rebalance_timeout_ms, "server_assignor": m.server_assignor,
            "member_epoch": m.member_epoch, "previous_member_epoch": m.previous_member_epoch,
            "state": int(m.state), "assigned": assignment_json(m.assigned),
            "pending_revocation": assignment_json(m.pending_revocation),
            "assigned_at": [[str(tid), p, e] for (tid, p), e in sorted(m.assigned_at.items())]}


def _member_state(value: int) -> MemberState:
    try:
        return MemberState(value)
    except ValueError:  # written by a newer version: reconciled from scratch (Kafka's UNKNOWN)
        return MemberState.UNKNOWN


def member_from_json(e: dict[str, Any]) -> Member:
    return Member(
        e["member_id"], e.get("instance_id"), e.get("rack_id"), e.get("client_id", ""), e.get("client_host", ""),
        tuple(e.get("subscribed_topic_names", ())), e.get("subscribed_topic_regex"), e.get("rebalance_timeout_ms", -1),
        e.get("server_assignor"), e["member_epoch"], e.get("previous_member_epoch", 0),
        _member_state(e.get("state", 0)), assignment_from_json(e.get("assigned", [])),
        assignment_from_json(e.get("pending_revocation", [])),
        {(uuid.UUID(t), p): epoch for t, p, epoch in e.get("assigned_at", ())})
