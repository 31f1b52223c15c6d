"""The groups' append-only record logs: a KIP-848 consumer group's records (`<group>.records` beside
the group's offsets file), a group's committed offsets (`<group>.offsets`) and a producer's
transactional offsets pending on an offsets partition (`txn-offsets/<N>/<producer id>.records`),
to which each change writes only the records of what changed, as Kafka appends only the changed
records to `__consumer_offsets` (issue 36, finding 2: every heartbeat rewrote the whole group,
1 MB and an fsync per join at 1,250 members; every OffsetCommit and TxnOffsetCommit rewrote the
group's offsets or the producer's pending offsets whole, 8.5 MB at 2,000 partitions).

Records are Kafka's, keyed as Kafka keys them, the latest value per key winning and a null value a
tombstone. A consumer group's: the group epoch (Kafka's type 3), the subscribed topics' metadata
(4), a member's metadata with its current assignment (5 and 8 in one record), the target
assignment epoch (6), a member's target (7), a regex's resolution (16). Offsets are Kafka's
OffsetCommit record (type 1, keyed by group, topic and partition; `storage.group_offsets` builds
them), pending transactional offsets the same, keyed by their group too.

One frame per record, as the controller's metadata log frames them:
    length  uint32  (bytes of payload)
    crc     uint32  CRC-32C of payload
    payload         UTF-8 JSON {"k": kind, "id": key within the log or absent, "v": value or null}
Recovery reads frames up to the first torn or corrupt one (a crash mid-append: nothing after it
was acknowledged) and logs what it ignores; the rest is cut by the next append, under the owner's
lease (a reader writes nothing).

Durability, two ways:
- `append(..., sync=True)` fsyncs before it returns (the file's directory too, for a file just
  created or replaced);
- `append(..., sync=False)` only writes (page cache: microseconds), and the log is what the
  broker's group commit (`broker.logs.fsync_batcher.GroupCommit`, which the produce path and
  the share groups use) sees as a partition: `durable_end_offset` counts the bytes ever appended
  (`writes`) that are on disk, `begin_sync / run_sync / end_sync` fsync off the event loop, one
  fsync for every append that came meanwhile. Nobody is answered before the fsync covering their
  append returned.
A failed write or fsync is cut back so that the file ends where the last durable append ended
(its waiters are told False: `sync_generation` moves), and if the cut fails too the log refuses
appends until it is read again.

Compaction: the log keeps the latest frame of every live key, so when the file has grown past
twice the live records (plus a slack), the live frames are written whole to a new file that
replaces the old one. Each compaction writes what at least as many appended bytes paid for, so
appends stay proportional to the change, not to the group. Under the group commit it runs off
the event loop too: the live frames are taken (a list of references) on the loop, written and
fsynced under a name of this log's on a thread, and put in place on the loop with the frames
appended meanwhile (`storage.durable.write_aside / install`); the directory's fsync rides on the
log's next fsync, and until it returned nothing the new file holds counts as durable that the
old one did not (a power cut may bring the old one back, which has all of it).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.core.groups.consumer_group import Changes, ConsumerGroupRecord, Member
from oncelog.core.groups.reconciliation import Assignment, MemberState
from oncelog.storage import failpoints as fp
from oncelog.storage import frames as framing
from oncelog.storage.durable import discard, fsync_dir, install, replace_file, write_aside

log = logging.getLogger(__name__)

SUFFIX = ".records"
# a compaction's new file while it is written off the loop (a crash's leftover is removed at open)
ASIDE_SUFFIX = ".compacting.tmp"
# a log is compacted once it is larger than twice its live records and this much
COMPACT_SLACK_BYTES = 256 << 10

Key = tuple[str, str]
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


@dataclass(eq=False)
class RecordLog:
    """One record file as this process last wrote or read it (compared, and hashed, by identity:
    the group commit keys its waiters by log)."""
    path: Path
    size: int = 0                                   # bytes of whole frames in the file
    inode: int = -1
    latest: dict[Key, bytes] = field(default_factory=dict)   # live key -> its latest frame
    live: int = 0                                   # bytes of `latest`
    failed: str | None = None
    writes: int = 0                                 # bytes appended (compactions not counted)
    synced: int = 0                                 # bytes of the file known to be on disk
    end: int = 0                                    # the file's size as last read or written
    generation: int = 0                             # moves when the file is replaced (compaction)
    durable_end_offset: int = 0                     # `writes` known to be on disk (file and name)
    sync_generation: int = 0                        # moves when a failure cut appends away
    closed: bool = False                            # deleted, or not this broker's: writes nothing more
    # around a compaction's rename: the owner's lease (`storage.group_offsets`), checked there
    guard: Callable[[], AbstractContextManager[None]] = nullcontext
    dir_unsynced: bool = False                      # created or replaced since its directory's fsync
    new_dirs: tuple[Path, ...] = ()                 # directories created for it, fsynced with its own
    compacting: list[bytes] | None = None           # frames appended while a compaction runs
    compact_after: int = 0                          # `writes` before a compaction is tried again
    just_compacted: bool = False                    # the last job was a compaction: an fsync next
    aside: str = field(default_factory=lambda: f".{secrets.token_hex(4)}{ASIDE_SUFFIX}")

    @classmethod
    def load(cls, path: Path) -> tuple[RecordLog, dict[Key, Any]]:
        """The log at `path` recovered (a torn tail ignored, cut by the next append), and the
        latest value of each live key."""
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
        return out, values

    @classmethod
    def read(cls, path: Path) -> tuple[RecordLog, ConsumerGroupRecord | None]:
        """A consumer group's log recovered, and the group its records make (None: no group
        epoch record)."""
        out, values = cls.load(path)
        return out, group_from(values)

    @classmethod
    def create(cls, path: Path, record: ConsumerGroupRecord) -> RecordLog:
        """A new log holding the whole group (a new group's file, or one converted from the
        whole-file format)."""
        return cls.create_whole(path, records_of(record))

    @classmethod
    def create_whole(cls, path: Path, records: Iterable[tuple[Key, Any]]) -> RecordLog:
        """A log holding `records`, durable when it returns (replacing any file at `path`)."""
        out = cls(path)
        out.write_whole(framed(records))
        return out

    @classmethod
    def create_empty(cls, path: Path, new_dirs: Sequence[Path] = ()) -> RecordLog:
        """A new, empty log (FileExistsError if there is a file): not durable until the fsync
        of its first append, which fsyncs its directory too, and `new_dirs` (directories just
        created for it, each in the next: their entries must be on disk as well)."""
        os.close(os.open(path, _NEW_FILE, 0o644))
        out = cls(path)
        out.inode = os.stat(path).st_ino
        out.dir_unsynced = True
        out.new_dirs = tuple(new_dirs)
        return out

    def _note(self, key: Key, frame: bytes, tombstone: bool) -> None:
        old = self.latest.pop(key, None)
        if old is not None:
            self.live -= len(old)
        if not tombstone:
            self.latest[key] = frame
            self.live += len(frame)

    def append(self, records: Iterable[tuple[Key, Any]], shared: bool, sync: bool = True) -> int:
        """Append the records ((key, value or None)); the bytes appended. Raises OSError with
        nothing of them left in the file when they could not be written (or made durable).
        `shared`: other brokers may have written the file since (ownership moved away and back),
        which is refused rather than written over. `sync=False`: written, not fsynced; the
        caller answers nobody before the group commit's fsync covered `writes`."""
        return self.append_frames([(key, _frame(key, value), value is None) for key, value in records], shared, sync)

    def append_frames(self, frames: Sequence[tuple[Key, bytes, bool]], shared: bool, sync: bool = True) -> int:
        """`append` of records framed by the caller ((key, frame, tombstone): `frame_payload`),
        for a writer of many records of one shape (a commit of thousands of offsets)."""
        if self.failed or self.closed:
            raise OSError(f"{self.path} refuses appends until it is read again: {self.failed or 'closed'}")
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
                    fp.group_truncate(fd, self.size)
                    self.end = self.size
                written = fp.group_write(fd, data, self.size)
                if written != len(data):
                    raise OSError(f"short write: {written} of {len(data)} bytes")
                if sync:
                    fp.group_sync(fd)
                    if self.dir_unsynced:
                        for directory in (self.path.parent, *self.new_dirs):
                            fsync_dir(directory)
            except OSError as e:
                self._cut_back(fd, self.size, e)
                raise
        finally:
            os.close(fd)
        self.size += len(data)
        self.end = self.size
        self.writes += len(data)
        if sync:
            self.synced = self.size
            self.dir_unsynced = False
            self.new_dirs = ()
            self.durable_end_offset = self.writes
        if self.compacting is not None:
            self.compacting.append(data)
        for key, frame, tombstone in frames:
            self._note(key, frame, tombstone)
        return len(data)

    # ------------------------------------------------------------------ the group commit's interface
    @property
    def offline(self) -> bool:
        """GroupCommit: appends still waited for are answered as not stored."""
        return self.failed is not None or self.closed

    def begin_sync(self, now_ms: int) -> tuple[Any, ...] | None:
        """On the loop: what to do off it (an fsync, or a compaction when one is due), None when
        everything appended is durable."""
        if self.offline:
            return None
        # never two compactions in a row: the appends they let wait get their fsync between two
        if self.compacting is None and self.writes >= self.compact_after and self.due() and not self.just_compacted:
            self.compacting = []
            self.just_compacted = True
            return ("compact", self.generation, tuple(self.latest.values()), self.writes)
        self.just_compacted = False
        if self.synced >= self.size and not self.dir_unsynced:
            self.durable_end_offset = self.writes   # (e.g. a sync append covered the rest)
            return None
        return ("fsync", self.generation, self.size, self.writes,
                (self.path.parent, *self.new_dirs) if self.dir_unsynced else ())

    def run_sync(self, token: tuple[Any, ...]) -> None:
        """On a group-commit thread (touches no state)."""
        if token[0] == "compact":
            write_aside(self.path, b"".join(token[2]), suffix=self.aside)
            return
        self.fsync(self.path)
        for directory in token[4]:
            fsync_dir(directory)

    @staticmethod
    def fsync(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            fp.group_sync(fd)
        finally:
            os.close(fd)

    def end_sync(self, token: tuple[Any, ...], error: BaseException | None, now_ms: int) -> None:
        """On the loop, after `run_sync`."""
        if token[0] == "compact":
            self._end_compaction(token, error)
            return
        _kind, generation, size, writes, directories = token
        if self.closed:
            return
        if error is None:
            if generation == self.generation:   # else replaced whole since (durably: `write_whole`)
                self.synced = max(self.synced, size)
                if directories:
                    self.dir_unsynced = False
                    self.new_dirs = ()
                if not self.dir_unsynced:
                    self.durable_end_offset = max(self.durable_end_offset, writes)
            return
        self.sync_failed(generation, error if isinstance(error, OSError) else OSError(f"fsync raised {error!r}"))

    def _end_compaction(self, token: tuple[Any, ...], error: BaseException | None) -> None:
        _kind, generation, frames, writes = token
        delta, self.compacting = self.compacting, None
        aside = self.path.with_name(self.path.name + self.aside)
        if error is None and (self.offline or generation != self.generation or delta is None):
            discard(aside)   # failed, dropped or replaced whole meanwhile: the old file stays
            return
        if error is None:
            base = sum(len(f) for f in frames)
            data = b"".join(delta or ())
            try:
                with self.guard():
                    self._install(aside, base, data, writes)
            except OSError as e:
                error = e
        if error is not None:
            discard(aside)
            # not a lost write: the old file is whole; tried again once as much was appended again
            self.compact_after = self.writes + self.live + COMPACT_SLACK_BYTES
            log.warning("%s: compaction failed (%s); the log keeps growing until the next one", self.path, error)
            return
        grown = self.size
        self.size = self.end = base + len(data)
        self.synced = self.size if self.durable_end_offset > writes else base   # (`_install`)
        self.inode = os.stat(self.path).st_ino
        self.generation += 1
        self.dir_unsynced = True
        log.info("%s: compacted from %d to %d bytes", self.path, grown, self.size)

    def _install(self, aside: Path, base: int, data: bytes, writes: int) -> None:
        """The compaction's file, with the frames appended while it was written, in place."""
        fp.replaced("groups", str(aside), base)   # (the power-loss ledger: fsynced off the loop)
        if data:
            fd = os.open(aside, os.O_WRONLY)
            try:
                written = fp.group_write(fd, data, base)
                if written != len(data):
                    raise OSError(f"short write: {written} of {len(data)} bytes")
                if self.durable_end_offset > writes:
                    # a sync append came meanwhile and was answered: what the new file holds of
                    # it must be on disk before the new file may replace the old
                    fp.group_sync(fd)
            finally:
                os.close(fd)
        install(aside, self.path, via=fp.group_rename)

    # ------------------------------------------------------------------ failures
    def sync_failed(self, generation: int, error: OSError) -> None:
        """An fsync failed: what was not known to be on disk is cut off (its writers are told
        the change was not stored, and the log is read again from the file)."""
        self.sync_generation += 1
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
        self.failed = self.failed or f"a failed fsync ({error}): it must be read again"

    def _cut_back(self, fd: int, size: int, error: OSError) -> None:
        try:
            fp.group_truncate(fd, size)
            fp.group_sync(fd)
        except OSError as e:
            self.failed = f"a failed append ({error}) could not be cut back to {size} bytes ({e})"
            log.critical("%s: %s", self.path, self.failed)
            return
        self.end = size
        log.error("%s: append failed (%s); cut back to %d bytes", self.path, error, size)

    # ------------------------------------------------------------------ compaction (on the loop)
    def due(self) -> bool:
        return self.size > 2 * self.live + COMPACT_SLACK_BYTES

    def compact(self) -> None:
        """The live records alone, in a new file replacing this one (durable when it returns)."""
        self.write_whole(list(self.latest.items()))

    def write_whole(self, frames: Sequence[tuple[Key, bytes]]) -> None:
        data = b"".join(f for _k, f in frames)
        replace_file(self.path, data)
        fp.replaced("groups", str(self.path), len(data))
        self.latest = dict(frames)
        self.live = self.size = self.synced = self.end = len(data)
        self.inode = os.stat(self.path).st_ino
        self.generation += 1
        self.failed = None
        self.dir_unsynced = False
        self.durable_end_offset = self.writes
        self.compacting = None   # a compaction under way is of the file replaced


def framed(records: Iterable[tuple[Key, Any]]) -> list[tuple[Key, bytes]]:
    """The frames of live records (tombstones left out: a file written whole needs none)."""
    return [(key, _frame(key, value)) for key, value in records if value is not None]


_JSON = json.JSONEncoder(separators=(",", ":"))   # (made once: json.dumps with options makes one per call)


def _frame(key: Key, value: Any) -> bytes:
    body: dict[str, Any] = {"k": key[0]}
    if key[1]:
        body["id"] = key[1]
    body["v"] = value
    return framing.frame(_JSON.encode(body).encode())


def frame_payload(key: Key, value_json: str | None) -> bytes:
    """The frame of a record whose value the caller wrote as JSON text (None: a tombstone)."""
    kind, id_ = key
    head = f'{{"k":{_quote(kind)},"id":{_quote(id_)},"v":' if id_ else f'{{"k":{_quote(kind)},"v":'
    return framing.frame(f"{head}{value_json if value_json is not None else 'null'}}}".encode())


_quote = json.encoder.encode_basestring_ascii   # a JSON string literal (C)


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
