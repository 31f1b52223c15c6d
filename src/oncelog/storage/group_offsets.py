"""Consumer groups' durable state: one small JSON file per group, replaced atomically and fsynced
(file and directory) before the request that changed it is answered, so a crash never loses or
half-writes a commit or a generation.

A group's file holds what Kafka's compacted `__consumer_offsets` keeps of it: the latest offset
committed for each partition (with its commit time, and an explicit expiry from OffsetCommit
v2-v4, for `offsets.retention.minutes`) and the latest group metadata record (Kafka's
GroupMetadataValue: protocol type, generation, protocol, leader, and each member's id, group
instance id, client id and host, timeouts, subscription and assignment; plus since when the group
has been empty). A KIP-848 consumer group's records (`core.groups.ConsumerGroupRecord`: group and
assignment epochs, each member's metadata, current and target assignment, the subscribed topics'
metadata and resolved regexes) are in a record log of their own beside it (`<group>.records`,
`storage.group_records`), to which a heartbeat appends only what it changed; files of format 3
that hold a consumer group whole still load, and move to a record log at the group's next change.
A group is of one type at a time. Replacing the offsets file is its compaction: nothing older
than the latest state is kept, and loading reads one file per group instead of replaying a log.
Files written before the group record existed (format 2: protocol type and empty-since only;
format 1: a bare list of offsets) still load, as groups without members.

Transactional offsets waiting for their transaction's marker live in one file per offsets
partition and producer id (`txn-offsets/<N>/<producer id>.json`), with what that `__consumer_offsets`
partition remembers of the producer (`core.txn.offsets`: its epoch and the coordinator epoch of its
last marker), so a marker checked after a restart meets the same state. (Files of one producer for
every partition, `txn-offsets/<producer id>.json`, written before issue 34, are split at open.)

In a cluster on one machine the brokers share this directory, and the groups of offsets partition
N are written only by N's owner, under its lease (`storage.fence`, `fences/<N>.epoch`): `take(N,
epoch)` raises N's token before the owner reads anything of N, and every write of N — a group's
file, its offsets, pending transactional offsets, a marker settling them — checks the token under
its lock first, so a broker deposed while paused writes nothing (`Fenced`, an OSError the group
coordinator answers NOT_COORDINATOR). Everything of N is in files of N alone, so owners of
different partitions never wait for each other, and a paused broker holds up nothing but what it
was writing when it stopped.
"""
from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from oncelog.core.groups.consumer_group import Changes, ConsumerGroupRecord
from oncelog.core.txn.log_format import partition_for
from oncelog.core.txn.offsets import OffsetsProducer, add_offsets, expired, take_marker
from oncelog.storage.durable import fsync_dir, replace_file
from oncelog.storage.fence import Fenced, Lease
from oncelog.storage.group_records import (
    SUFFIX,
    RecordLog,
    assignment_from_json,
    assignment_json,
    changed_records,
    member_from_json,
    member_json,
)

log = logging.getLogger(__name__)

_FORMAT = 3
_PENDING_FORMAT = 3          # one (offsets partition, producer) per file
_PENDING_FORMAT_BY_PID = 2   # every partition of one producer in one file (before issue 34)


class Committed(NamedTuple):
    offset: int
    metadata: str | None
    leader_epoch: int = -1
    commit_timestamp: int = -1   # ms since the epoch; -1: unknown (an older file)
    expire_timestamp: int = -1   # ms; set by OffsetCommit v2-v4's retention time, else -1


class MemberMeta(NamedTuple):
    """One member in a group metadata record (Kafka's MemberMetadata of GroupMetadataValue v3)."""
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes   # the member's metadata for the group's protocol
    assignment: bytes


@dataclass(frozen=True)
class GroupMeta:
    """A group's metadata record. With members, the group was Stable at `generation` when it was
    written (a record is written when a generation's assignment is handed out); without, Empty
    since `empty_since_ms` (None before any record: a group of offsets only)."""
    protocol_type: str | None = None   # None: offsets only (a consumer using assign), no members ever
    empty_since_ms: int | None = None  # when the group last became empty; None: it has members
    generation: int = 0
    protocol: str | None = None
    leader: str | None = None
    members: tuple[MemberMeta, ...] = ()


# a group's file: its committed offsets, its classic metadata record, its KIP-848 records (or None)
_Entry = tuple[dict[tuple[str, int], Committed], GroupMeta, ConsumerGroupRecord | None]


class GroupOffsetStore:
    def __init__(self, directory: str | Path, shared: bool = False, offsets_partitions: int = 50) -> None:
        """`shared`: brokers of a cluster share the directory and a group's coordinator can move,
        so every read goes to the file (never a cached copy another broker may have replaced), and
        every write needs the lease of its offsets partition (`take`).
        `offsets_partitions`: `offsets.topic.num.partitions`, which places a group (and its
        transactional offsets) on a partition."""
        self.shared = shared
        self.offsets_partitions = offsets_partitions
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._groups: dict[str, _Entry] = {}
        for path in self.directory.glob("*.json"):
            group = urllib.parse.unquote(path.stem)
            self._groups[group] = _read(path)
        # consumer groups' record logs (`storage.group_records`): those read or written here
        self._records: dict[str, RecordLog] = {}
        self._record_names = {urllib.parse.unquote(p.name[:-len(SUFFIX)]) for p in self.directory.glob("*" + SUFFIX)}
        # Transactional offsets (TxnOffsetCommit) waiting for their transaction's marker, with the
        # offsets partitions' producer state: producer id -> offsets partition -> entry, one
        # fsynced file per (partition, producer), so a marker that arrives after a restart still
        # finds them (docs/transactions.md section 4).
        self.pending_dir = self.directory / "txn-offsets"
        self.pending_dir.mkdir(exist_ok=True)
        self.fences_dir = self.directory / "fences"
        self._leases: dict[int, Lease] = {}
        self._producers: dict[int, dict[int, OffsetsProducer]] = {}
        self._split_files_by_producer()
        for path in self.pending_dir.glob("*/*.json"):
            self._producers.setdefault(int(path.stem), {})[int(path.parent.name)] = self._read_entry(path)

    # ------------------------------------------------------------ ownership (a cluster)
    def partition_of(self, group: str) -> int:
        return partition_for(group, self.offsets_partitions)

    def take(self, partition: int, epoch: int) -> None:
        """This broker owns offsets partition `partition` at leader epoch `epoch` from now on: its
        token raised (`storage.fence.Lease.take`: Fenced when a newer owner has it, Busy when
        another process holds its lock: try again later)."""
        held = self._leases.get(partition)
        if held is not None:
            if held.epoch == epoch and held.valid():
                return
            self.release(partition)
        self.fences_dir.mkdir(exist_ok=True)
        self._leases[partition] = Lease.take(self.fences_dir / f"{partition}.epoch", epoch,
                                             f"__consumer_offsets-{partition}")

    def release(self, partition: int) -> None:
        lease = self._leases.pop(partition, None)
        if lease is not None:
            lease.close()

    def owns(self, partition: int) -> bool:
        """Not shared: always. Shared: this broker holds the partition's lease and no newer owner
        raised its token (a memory load; what the coordinator checks before it answers from
        memory)."""
        if not self.shared:
            return True
        lease = self._leases.get(partition)
        return lease is not None and lease.valid()

    def owned(self) -> list[tuple[int, int]]:
        """(partition, epoch) of the leases held."""
        return sorted((p, lease.epoch) for p, lease in self._leases.items())

    @contextmanager
    def _writing(self, partition: int) -> Iterator[None]:
        """Around a write of partition `partition`'s files: its lease's lock after its check."""
        if not self.shared:
            yield
            return
        lease = self._leases.get(partition)
        if lease is None:
            raise Fenced(f"__consumer_offsets-{partition}", -1, -1)
        with lease.writing():
            yield

    def writing_group(self, group: str) -> AbstractContextManager[None]:
        """Around a write of something else the group owns (its share groups' state,
        `storage.share_state`): the lease of the group's offsets partition."""
        return self._writing(self.partition_of(group))

    def close(self) -> None:
        for partition in list(self._leases):
            self.release(partition)

    def groups(self) -> list[str]:
        if self.shared:
            return sorted({urllib.parse.unquote(p.stem) for p in self.directory.glob("*.json")}
                          | {urllib.parse.unquote(p.name[:-len(SUFFIX)]) for p in self.directory.glob("*" + SUFFIX)})
        return sorted(set(self._groups) | self._record_names)

    def _entry(self, group: str) -> _Entry:
        if self.shared:
            self._groups.pop(group, None)
            try:
                self._groups[group] = _read(self._path(group))
            except FileNotFoundError:
                pass  # none, or another broker removed it
        return self._groups.get(group, ({}, GroupMeta(), None))

    def get(self, group: str) -> dict[tuple[str, int], Committed]:
        return self._entry(group)[0]

    def meta(self, group: str) -> GroupMeta:
        return self._entry(group)[1]

    def consumer(self, group: str) -> ConsumerGroupRecord | None:
        """The group's KIP-848 records, read from its record log (recovered; kept open for the
        appends that follow); None when it is not a consumer group."""
        path = self._records_path(group)
        try:
            records, record = RecordLog.read(path)
        except FileNotFoundError:
            self._records.pop(group, None)
            return self._entry(group)[2]   # written whole, before record logs (format 3)
        self._records[group] = records
        return record

    def is_consumer(self, group: str) -> bool:
        """Whether the group is a consumer group, without reading its records."""
        if group in self._records or self._records_path(group).exists():
            return True
        return self._entry(group)[2] is not None

    def append_consumer(self, group: str, changes: Changes, whole: Callable[[], ConsumerGroupRecord],
                        new: bool, sync: bool = True) -> int:
        """The records of a consumer group's change, appended to its record log and fsynced;
        `whole()` the group after it, written whole when the group has no log yet (`new`: it was
        just created; a classic record of an empty classic group of that id goes). The bytes
        written, compactions aside (what a heartbeat costs the disk). `sync=False`: not fsynced
        yet (`RecordLog.unsynced`): the caller answers nobody before it is."""
        with self._writing(self.partition_of(group)):
            log_ = None if new else self._records.get(group)
            if log_ is None:
                offsets, meta, legacy = self._entry(group)
                path = self._records_path(group)
                log_ = self._records[group] = RecordLog.create(path, whole())
                self._record_names.add(group)
                if meta != GroupMeta() or legacy is not None:
                    self._write(group, offsets, GroupMeta(), None)
                return log_.size
            written = log_.append(changed_records(changes), self.shared, sync)
            if log_.due():
                grown = log_.size
                log_.compact()
                log.info("group %s: records compacted from %d to %d bytes", group, grown, log_.size)
            return written

    def consumer_log(self, group: str) -> RecordLog | None:
        """The group's record log as this broker last read or wrote it (bytes written, size)."""
        return self._records.get(group)

    def close_consumer(self, group: str) -> None:
        """This broker no longer coordinates the group: what it knew of its log is forgotten (the
        next owner, or this one later, reads the file again)."""
        self._records.pop(group, None)

    def drop_consumer(self, group: str) -> None:
        """The group is no longer a consumer group: its records go, its offsets stay."""
        with self._writing(self.partition_of(group)):
            self._drop_records(group)
            offsets, meta, legacy = self._entry(group)
            if legacy is not None:
                self._write(group, offsets, meta, None)

    def _drop_records(self, group: str) -> None:
        self._records.pop(group, None)
        self._record_names.discard(group)
        _unlink(self._records_path(group))

    def _path(self, group: str) -> Path:
        return self.directory / (urllib.parse.quote(group, safe="") + ".json")

    def _records_path(self, group: str) -> Path:
        return self.directory / (urllib.parse.quote(group, safe="") + SUFFIX)

    def commit(self, group: str, offsets: Mapping[tuple[str, int], Committed]) -> None:
        """Offsets join the group's; its metadata record stays as it is."""
        with self._writing(self.partition_of(group)):
            current, meta, consumer = self._entry(group)
            self._write(group, {**current, **offsets}, meta, consumer)

    def set_meta(self, group: str, meta: GroupMeta) -> None:
        """The group's metadata record, beside its offsets."""
        with self._writing(self.partition_of(group)):
            offsets, old, consumer = self._entry(group)
            if meta != old or group not in self._groups:
                self._write(group, offsets, meta, consumer)

    def remove(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        """Forget some offsets of a group (all of them, and the group, when `partitions` is None).
        A group left without offsets keeps its file only while its record has members."""
        with self._writing(self.partition_of(group)):
            offsets, meta, consumer = self._entry(group)
            gone = None if partitions is None else set(partitions)
            kept = {} if gone is None else {k: v for k, v in offsets.items() if k not in gone}
            if partitions is None:
                self._drop_records(group)
            if kept or (gone is not None and (meta.members or (consumer is not None and consumer.members))):
                self._write(group, kept, meta, consumer)
                return
            self._groups.pop(group, None)
            _unlink(self._path(group))

    def delete_topic(self, topic: str) -> None:
        """The topic's offsets leave every group this broker owns (the owners of the others do
        the same for theirs)."""
        for group in self.groups():
            if not self.owns(self.partition_of(group)):
                continue
            gone = [k for k in self.get(group) if k[0] == topic]
            if gone:
                self.remove(group, gone)

    def _write(self, group: str, offsets: dict[tuple[str, int], Committed], meta: GroupMeta,
               consumer: ConsumerGroupRecord | None) -> None:
        data: dict[str, Any] = {"format": _FORMAT, "protocol_type": meta.protocol_type,
                                "empty_since_ms": meta.empty_since_ms, "generation": meta.generation,
                                "protocol": meta.protocol, "leader": meta.leader,
                                "members": [_member_json(m) for m in meta.members],
                                "offsets": _offsets_json(offsets)}
        if consumer is not None:
            data["consumer_group"] = _consumer_json(consumer)
        _write_json(self._path(group), data)
        self._groups[group] = (offsets, meta, consumer)

    # ------------------------------------------------------------ transactional offsets
    def pending(self, partition: int | None = None) -> dict[int, dict[str, dict[tuple[str, int], Committed]]]:
        """producer id -> group -> offsets not yet made visible, of offsets partition `partition`
        (all when None). Shared: read from the files."""
        if self.shared:
            pattern = f"{partition}/*.json" if partition is not None else "*/*.json"
            producers: dict[int, dict[int, OffsetsProducer]] = {}
            for path in self.pending_dir.glob(pattern):
                try:
                    producers.setdefault(int(path.stem), {})[int(path.parent.name)] = self._read_entry(path)
                except FileNotFoundError:
                    continue   # settled meanwhile
        else:
            producers = self._producers
        out: dict[int, dict[str, dict[tuple[str, int], Committed]]] = {}
        for pid, partitions in producers.items():
            groups = {g: dict(o) for p, entry in partitions.items() if partition is None or p == partition
                      for g, o in entry.pending.items()}
            if groups:
                out[pid] = groups
        return out

    def _entry_path(self, partition: int, producer_id: int) -> Path:
        return self.pending_dir / str(partition) / f"{producer_id}.json"

    def _producer_entry(self, partition: int, producer_id: int) -> OffsetsProducer | None:
        """What offsets partition `partition` keeps of the producer (from its file when shared)."""
        if self.shared:
            try:
                return self._read_entry(self._entry_path(partition, producer_id))
            except FileNotFoundError:
                return None
        return self._producers.get(producer_id, {}).get(partition)

    def add_pending(self, producer_id: int, producer_epoch: int, group: str,
                    offsets: Mapping[tuple[str, int], Committed], now_ms: int) -> int:
        """A TxnOffsetCommit's offsets, pending on the group's offsets partition; durable
        (fsynced) before it returns NONE. INVALID_PRODUCER_EPOCH for an epoch older than that
        partition knows of the producer."""
        partition = self.partition_of(group)
        with self._writing(partition):
            code, _message, entry = add_offsets(self._producer_entry(partition, producer_id), producer_epoch, group,
                                                offsets, now_ms)
            if entry is not None:
                self._write_entry(partition, producer_id, entry)
            return code

    def apply_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                     partition: int, now_ms: int, transaction_version: int = 0) -> tuple[int, str | None]:
        """The transaction's marker on `__consumer_offsets-<partition>`, checked as a data
        partition checks it (`core.txn.offsets.take_marker`); only a marker taken settles the
        producer's pending offsets there: COMMIT commits them to their groups, ABORT drops them.
        The producer's file is written last, so a marker repeated after a crash finds what is
        left. Returns (code, why refused)."""
        with self._writing(partition):
            code, message, entry, settled = take_marker(self._producer_entry(partition, producer_id), producer_id,
                                                        producer_epoch, coordinator_epoch, now_ms, transaction_version)
            if code:
                return code, message
            if commit:
                for group, offsets in settled.items():
                    self.commit(group, offsets)
            assert entry is not None  # taken
            self._write_entry(partition, producer_id, entry)
            return code, None

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle on an offsets partition for `producer.id.expiration.ms`, never
        one with offsets pending there (of the partitions this broker owns, when shared).
        Returns how many entries went."""
        removed = 0
        if self.shared:
            entries = [(int(path.parent.name), int(path.stem)) for path in self.pending_dir.glob("*/*.json")]
        else:
            entries = [(p, pid) for pid, parts in self._producers.items() for p in parts]
        for partition, pid in entries:
            if not self.owns(partition):
                continue
            with self._writing(partition):
                entry = self._producer_entry(partition, pid)
                if entry is not None and expired(entry, now_ms, expiration_ms):
                    self._write_entry(partition, pid, None)
                    removed += 1
        return removed

    def _write_entry(self, partition: int, producer_id: int, entry: OffsetsProducer | None) -> None:
        path = self._entry_path(partition, producer_id)
        if entry is None:
            parts = self._producers.get(producer_id, {})
            parts.pop(partition, None)
            if not parts:
                self._producers.pop(producer_id, None)
            _unlink(path)
            return
        path.parent.mkdir(exist_ok=True)
        _write_json(path, {"format": _PENDING_FORMAT, "epoch": entry.epoch,
                           "coordinator_epoch": entry.coordinator_epoch, "updated_ms": entry.updated_ms,
                           "groups": {g: _offsets_json(o) for g, o in sorted(entry.pending.items())}})
        self._producers.setdefault(producer_id, {})[partition] = entry

    @staticmethod
    def _read_entry(path: Path) -> OffsetsProducer:
        e = json.loads(path.read_text())
        return OffsetsProducer(e["epoch"], e["coordinator_epoch"], e["updated_ms"],
                               {g: _offsets_from_json(o) for g, o in e["groups"].items()})

    def _split_files_by_producer(self) -> None:
        """Files of one producer for every partition (formats 1 and 2) become one file per
        partition; under the directory's lock, so that brokers starting together split each
        once. A partition's file already written in the new layout wins."""
        old = list(self.pending_dir.glob("*.json"))
        if not old:
            return
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for path in old:
                try:
                    entries = self._read_producer_file(path)
                except FileNotFoundError:
                    continue   # another broker split it
                for partition, entry in entries.items():
                    if not self._entry_path(partition, int(path.stem)).exists():
                        self._write_entry(partition, int(path.stem), entry)
                _unlink(path)
        finally:
            os.close(fd)

    def _read_producer_file(self, path: Path) -> dict[int, OffsetsProducer]:
        data = json.loads(path.read_text())
        if data.get("format") != _PENDING_FORMAT_BY_PID:
            # format 1: group -> offsets, no producer state (any marker is taken, as before)
            out: dict[int, dict[str, Any]] = {}
            for group, entries in data.items():
                out.setdefault(self.partition_of(group), {})[group] = _offsets_from_json(entries)
            return {p: OffsetsProducer(pending=groups) for p, groups in out.items()}
        return {int(p): OffsetsProducer(e["epoch"], e["coordinator_epoch"], e["updated_ms"],
                                        {g: _offsets_from_json(o) for g, o in e["groups"].items()})
                for p, e in data["partitions"].items()}


def _member_json(m: MemberMeta) -> dict[str, Any]:
    return {"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
            "client_host": m.client_host, "rebalance_timeout_ms": m.rebalance_timeout_ms,
            "session_timeout_ms": m.session_timeout_ms,
            "subscription": base64.b64encode(m.subscription).decode(),
            "assignment": base64.b64encode(m.assignment).decode()}


def _member_from_json(e: dict[str, Any]) -> MemberMeta:
    return MemberMeta(e["member_id"], e.get("instance_id"), e["client_id"], e["client_host"],
                      e["rebalance_timeout_ms"], e["session_timeout_ms"], base64.b64decode(e["subscription"]),
                      base64.b64decode(e["assignment"]))


def _offsets_json(offsets: Mapping[tuple[str, int], Committed]) -> list[dict[str, Any]]:
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
    """Replace `path` with `data` as JSON, durably (`storage.durable.replace_file`)."""
    replace_file(path, json.dumps(data))


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def _read(path: Path) -> _Entry:
    data = json.loads(path.read_text())
    if isinstance(data, list):  # format 1: the offsets alone
        return _offsets_from_json(data), GroupMeta(), None
    meta = GroupMeta(data.get("protocol_type"), data.get("empty_since_ms"), data.get("generation", 0),
                     data.get("protocol"), data.get("leader"),
                     tuple(_member_from_json(m) for m in data.get("members", ())))
    consumer = data.get("consumer_group")
    return (_offsets_from_json(data["offsets"]), meta,
            _consumer_from_json(consumer) if consumer is not None else None)


def _consumer_json(r: ConsumerGroupRecord) -> dict[str, Any]:
    """A consumer group written whole into its offsets file (format 3, before record logs)."""
    return {"group_epoch": r.group_epoch, "assignment_epoch": r.assignment_epoch,
            "subscribed_topics": [{"name": n, "topic_id": str(tid), "partitions": p}
                                  for n, tid, p in r.subscribed_topics],
            "regexes": [{"regex": rx, "topics": sorted(ts)} for rx, ts in r.regex_topics],
            "members": [member_json(m) for m in r.members],
            "targets": [{"member_id": mid, "partitions": assignment_json(a)} for mid, a in r.target]}


def _consumer_from_json(d: dict[str, Any]) -> ConsumerGroupRecord:
    return ConsumerGroupRecord(
        d["group_epoch"], d["assignment_epoch"], tuple(member_from_json(e) for e in d.get("members", ())),
        tuple((t["member_id"], assignment_from_json(t["partitions"])) for t in d.get("targets", ())),
        tuple((t["name"], uuid.UUID(t["topic_id"]), t["partitions"]) for t in d.get("subscribed_topics", ())),
        tuple((r["regex"], frozenset(r["topics"])) for r in d.get("regexes", ())))
