"""Consumer groups' durable state, written before the request that changed it is answered, so a
crash never loses or half-writes a commit or a generation. What Kafka's compacted
`__consumer_offsets` keeps of a group is in files of the group's:

- `<group>.offsets`: its committed offsets, a record log (`storage.group_records`) of Kafka's
  OffsetCommit records, the latest per partition winning (the offset, its metadata and leader
  epoch, its commit time, and an explicit expiry from OffsetCommit v2-v4, for
  `offsets.retention.minutes`; a deleted offset is a tombstone). A commit appends the records of
  the partitions it names, nothing else (issue 36: each commit rewrote and fsynced the group's
  whole file, 8.5 MB for 2,000 partitions at the largest metadata allowed, on the event loop); the
  log is compacted as the consumer groups' are. `commit(..., sync=False)` leaves the fsync to the
  caller's group commit (`broker.groups.record_sync`).
- `<group>.json`, replaced atomically and fsynced (file and directory): the latest group metadata
  record (Kafka's GroupMetadataValue: protocol type, generation, protocol, leader, and each
  member's id, group instance id, client id and host, timeouts, subscription and assignment; plus
  since when the group has been empty), written when a classic group's generation changes. Files
  written before offset logs hold the offsets too (format 3 and earlier); they still load, and
  move to the group's offset log at its next commit (the log is written whole and durable first,
  then the file without them: a crash between the two leaves both, and the log wins).
A KIP-848 consumer group's records (`core.groups.ConsumerGroupRecord`: group and
assignment epochs, each member's metadata, current and target assignment, the subscribed topics'
metadata and resolved regexes) are in a record log of their own beside it (`<group>.records`,
`storage.group_records`), to which a heartbeat appends only what it changed; files of format 3
that hold a consumer group whole still load, and move to a record log at the group's next change.
A group is of one type at a time. Files written before the group record existed (format 2:
protocol type and empty-since only; format 1: a bare list of offsets) still load, as groups
without members.

Transactional offsets waiting for their transaction's marker live in one record log per offsets
partition and producer id (`txn-offsets/<N>/<producer id>.records`), with what that
`__consumer_offsets` partition remembers of the producer (`core.txn.offsets`: its epoch and the
coordinator epoch of its last marker, one record), so a marker checked after a restart meets the
same state. A TxnOffsetCommit appends the records of its partitions (and the producer's); the
marker rewrites the log whole, small again (the producer's record alone). JSON files of one
(partition, producer) (`<producer id>.json`, before record logs) still load and become a log at
the next write; files of one producer for every partition, `txn-offsets/<producer id>.json`,
written before issue 34, are split at open.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
    ASIDE_SUFFIX,
    SUFFIX,
    Key,
    RecordLog,
    assignment_from_json,
    assignment_json,
    changed_records,
    frame_payload,
    framed,
    member_from_json,
    member_json,
    records_of,
)

log = logging.getLogger(__name__)

_FORMAT = 3
_PENDING_FORMAT = 3          # one (offsets partition, producer) per JSON file (before record logs)
OFFSETS_SUFFIX = ".offsets"  # a group's committed offsets (`storage.group_records`)
_PRODUCER: Key = ("producer", "")
Frame = tuple[Key, bytes, bool]   # (key, frame, tombstone): `RecordLog.append_frames`
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
        # groups' offset logs: those read or written here, with the offsets they hold
        self._offsets: dict[str, tuple[RecordLog, dict[tuple[str, int], Committed]]] = {}
        self._offsets_names = {urllib.parse.unquote(p.name[:-len(OFFSETS_SUFFIX)])
                               for p in self.directory.glob("*" + OFFSETS_SUFFIX)}
        # Transactional offsets (TxnOffsetCommit) waiting for their transaction's marker, with the
        # offsets partitions' producer state: producer id -> offsets partition -> entry, one
        # fsynced file per (partition, producer), so a marker that arrives after a restart still
        # finds them (docs/transactions.md section 4).
        self.pending_dir = self.directory / "txn-offsets"
        self.pending_dir.mkdir(exist_ok=True)
        self.fences_dir = self.directory / "fences"
        self._leases: dict[int, Lease] = {}
        self._producers: dict[int, dict[int, OffsetsProducer]] = {}
        self._pending_logs: dict[tuple[int, int], RecordLog] = {}   # (partition, producer id) -> its log
        for leftover in [*self.directory.glob("*" + ASIDE_SUFFIX), *self.pending_dir.glob("*/*" + ASIDE_SUFFIX)]:
            _unlink(leftover)   # a compaction a crash interrupted: the log it was of is whole
        self._split_files_by_producer()
        if not shared:
            for partition, producer_id in self._pending_keys():
                self._load_pending(partition, producer_id)

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
                          | {urllib.parse.unquote(p.name[:-len(SUFFIX)]) for p in self.directory.glob("*" + SUFFIX)}
                          | {urllib.parse.unquote(p.name[:-len(OFFSETS_SUFFIX)])
                             for p in self.directory.glob("*" + OFFSETS_SUFFIX)})
        return sorted(set(self._groups) | self._record_names | self._offsets_names)

    def _entry(self, group: str) -> _Entry:
        if self.shared:
            self._groups.pop(group, None)
            try:
                self._groups[group] = _read(self._path(group))
            except FileNotFoundError:
                pass  # none, or another broker removed it
        return self._groups.get(group, ({}, GroupMeta(), None))

    def get(self, group: str) -> dict[tuple[str, int], Committed]:
        """The group's committed offsets (the store's own dict: read it, never keep it across an
        await)."""
        entry = self._offsets_entry(group)
        return entry[1] if entry is not None else self._entry(group)[0]

    def _offsets_entry(self, group: str) -> tuple[RecordLog, dict[tuple[str, int], Committed]] | None:
        """The group's offset log and its offsets; None when it has none (yet). Read again from
        the file when shared and another broker wrote it since, or after a failure cut it."""
        cached = self._offsets.get(group)
        path = self._offsets_path(group)
        if cached is not None and not cached[0].offline:
            if not self.shared:
                return cached
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_ino == cached[0].inode and st.st_size == cached[0].end:
                return cached
        elif cached is None and not self.shared and group not in self._offsets_names:
            return None
        if cached is not None:
            cached[0].closed = True
            del self._offsets[group]
        try:
            log_, values = RecordLog.load(path)
        except FileNotFoundError:
            self._offsets_names.discard(group)
            return None
        log_.guard = self.writing_group_factory(group)
        offsets = {(v["topic"], v["partition"]): _committed(v) for (kind, _id), v in values.items() if kind == "offset"}
        self._offsets[group] = entry = (log_, offsets)
        self._offsets_names.add(group)
        return entry

    def offsets_log(self, group: str) -> RecordLog | None:
        """The group's offset log as this broker last wrote it (what a commit waits on)."""
        entry = self._offsets.get(group)
        return entry[0] if entry is not None else None

    def writing_group_factory(self, group: str) -> Callable[[], AbstractContextManager[None]]:
        """What a log of the group holds around a write of its own (a compaction's rename)."""
        return lambda: self.writing_group(group)

    def meta(self, group: str) -> GroupMeta:
        return self._entry(group)[1]

    def consumer(self, group: str) -> ConsumerGroupRecord | None:
        """The group's KIP-848 records, read from its record log (recovered; kept open for the
        appends that follow); None when it is not a consumer group."""
        path = self._records_path(group)
        self.close_consumer(group)
        try:
            records, record = RecordLog.read(path)
        except FileNotFoundError:
            return self._entry(group)[2]   # written whole, before record logs (format 3)
        records.guard = self.writing_group_factory(group)
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
        yet: the caller answers nobody before the group commit covered `consumer_log(group).writes`."""
        with self._writing(self.partition_of(group)):
            log_ = None if new else self._records.get(group)
            if log_ is None:
                offsets, meta, legacy = self._entry(group)
                path = self._records_path(group)
                self.close_consumer(group)
                self._record_names.add(group)
                if meta != GroupMeta() or legacy is not None:
                    # a classic group's record, or the whole-file format, becomes the log: the log
                    # durable first, then the file without it
                    log_ = self._records[group] = RecordLog.create(path, whole())
                    log_.guard = self.writing_group_factory(group)
                    self._write(group, offsets, GroupMeta(), None)
                    return log_.size
                try:   # a new group: its records appended as any change's (fsynced as the caller says)
                    log_ = RecordLog.create_empty(path)
                except FileExistsError:   # a leftover no group reads: replaced
                    log_ = RecordLog.create(path, whole())
                    log_.guard = self.writing_group_factory(group)
                    self._records[group] = log_
                    return log_.size
                log_.guard = self.writing_group_factory(group)
                self._records[group] = log_
                try:
                    return log_.append(records_of(whole()), self.shared, sync)
                except OSError:
                    self._drop_records(group)   # no group of this id after all
                    raise
            written = log_.append(changed_records(changes), self.shared, sync)
            if sync and log_.due():   # (else the group commit compacts it, off the event loop)
                grown = log_.size
                log_.compact()
                log.info("group %s: records compacted from %d to %d bytes", group, grown, log_.size)
            return written

    def consumer_log(self, group: str) -> RecordLog | None:
        """The group's record log as this broker last read or wrote it (bytes written, size)."""
        return self._records.get(group)

    def close_consumer(self, group: str) -> None:
        """This broker no longer coordinates the group: what it knew of its log is forgotten (the
        next owner, or this one later, reads the file again); its appends still waiting for an
        fsync are answered as not stored, and a compaction of it under way is not installed."""
        records = self._records.pop(group, None)
        if records is not None:
            records.closed = True

    def drop_consumer(self, group: str) -> None:
        """The group is no longer a consumer group: its records go, its offsets stay."""
        with self._writing(self.partition_of(group)):
            self._drop_records(group)
            offsets, meta, legacy = self._entry(group)
            if legacy is not None:
                self._write(group, offsets, meta, None)

    def _drop_records(self, group: str) -> None:
        self.close_consumer(group)
        self._record_names.discard(group)
        _unlink(self._records_path(group))

    def _path(self, group: str) -> Path:
        return self.directory / (urllib.parse.quote(group, safe="") + ".json")

    def _records_path(self, group: str) -> Path:
        return self.directory / (urllib.parse.quote(group, safe="") + SUFFIX)

    def _offsets_path(self, group: str) -> Path:
        return self.directory / (urllib.parse.quote(group, safe="") + OFFSETS_SUFFIX)

    def commit(self, group: str, offsets: Mapping[tuple[str, int], Committed], sync: bool = True,
               frames: Sequence[Frame] | None = None) -> None:
        """Offsets join the group's: their records appended to its offset log, and only theirs;
        fsynced unless `sync=False` (then nobody is answered before the group commit covered
        `offsets_log(group).writes`). Its metadata record stays as it is. `frames`: the
        records as `offset_frames(offsets)` made them (a caller that spread the work)."""
        with self._writing(self.partition_of(group)):
            entry = self._offsets_entry(group)
            if entry is None:
                entry = self._new_offsets_log(group, offsets)
                if entry is None:
                    return   # written whole with the file's offsets (durable)
            log_, current = entry
            log_.append_frames(frames if frames is not None else offset_frames(offsets.items()), self.shared, sync)
            current.update(offsets)
            if sync and log_.due():
                grown = log_.size
                log_.compact()
                log.info("group %s: offsets compacted from %d to %d bytes", group, grown, log_.size)

    def _new_offsets_log(self, group: str, offsets: Mapping[tuple[str, int], Committed]
                         ) -> tuple[RecordLog, dict[tuple[str, int], Committed]] | None:
        """The group's first offset log: empty (its first append makes it durable), or, when the
        group's file holds offsets (written before offset logs), those and `offsets` whole and
        durable, then the file without them (None: nothing left to append)."""
        path = self._offsets_path(group)
        legacy, meta, consumer = self._entry(group)
        if legacy:
            merged = {**legacy, **offsets}
            log_ = RecordLog.create_whole(path, [(_offset_key(tp), _offset_json(tp, c)) for tp, c in merged.items()])
            log_.guard = self.writing_group_factory(group)
            self._offsets[group] = (log_, merged)
            self._offsets_names.add(group)
            self._write(group, {}, meta, consumer)
            return None
        try:
            log_ = RecordLog.create_empty(path)
        except FileExistsError:   # one this broker did not know of (written since it looked): read it
            self._offsets_names.add(group)
            found = self._offsets_entry(group)
            if found is None:
                raise
            return found
        log_.guard = self.writing_group_factory(group)
        entry = self._offsets[group] = (log_, {})
        self._offsets_names.add(group)
        return entry

    def _drop_offsets(self, group: str) -> None:
        entry = self._offsets.pop(group, None)
        if entry is not None:
            entry[0].closed = True
        self._offsets_names.discard(group)
        _unlink(self._offsets_path(group))

    def set_meta(self, group: str, meta: GroupMeta) -> None:
        """The group's metadata record, beside its offsets."""
        with self._writing(self.partition_of(group)):
            offsets, old, consumer = self._entry(group)
            if meta != old or group not in self._groups:
                self._write(group, offsets, meta, consumer)

    def remove(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        """Forget some offsets of a group (tombstones in its offset log, fsynced; all of them,
        and the group, when `partitions` is None). A group left without offsets keeps its file
        only while its record has members."""
        with self._writing(self.partition_of(group)):
            offsets, meta, consumer = self._entry(group)
            entry = self._offsets_entry(group)
            if partitions is None:
                self._drop_records(group)
                self._drop_offsets(group)
                self._groups.pop(group, None)
                _unlink(self._path(group))
                return
            gone = set(partitions)
            if entry is not None:
                log_, current = entry
                removed = [tp for tp in gone if tp in current]
                if removed:
                    log_.append([(_offset_key(tp), None) for tp in removed], self.shared)
                    for tp in removed:
                        del current[tp]
                left = bool(current)
            else:
                kept = {k: v for k, v in offsets.items() if k not in gone}
                left = bool(kept)
            if left or meta.members or (consumer is not None and consumer.members):
                if entry is None and len(kept) != len(offsets):
                    self._write(group, kept, meta, consumer)
                return
            self._drop_offsets(group)
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
        if offsets and self._offsets_entry(group) is not None:
            offsets = {}   # the offset log holds them (a file from before it, rewritten: without them)
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
            producers: dict[int, dict[int, OffsetsProducer]] = {}
            for part, pid in self._pending_keys(partition):
                entry = self._pending_entry(part, pid)
                if entry is not None:   # (else settled meanwhile)
                    producers.setdefault(pid, {})[part] = entry
        else:
            producers = self._producers
        out: dict[int, dict[str, dict[tuple[str, int], Committed]]] = {}
        for pid, partitions in producers.items():
            groups = {g: dict(o) for p, entry in partitions.items() if partition is None or p == partition
                      for g, o in entry.pending.items()}
            if groups:
                out[pid] = groups
        return out

    def _pending_keys(self, partition: int | None = None) -> set[tuple[int, int]]:
        """(partition, producer id) of the files of pending offsets (logs and older JSON files)."""
        where = str(partition) if partition is not None else "*"
        return {(int(path.parent.name), int(path.name.split(".", 1)[0]))
                for pattern in (f"{where}/*.json", f"{where}/*{SUFFIX}") for path in self.pending_dir.glob(pattern)}

    def _entry_path(self, partition: int, producer_id: int) -> Path:
        return self.pending_dir / str(partition) / f"{producer_id}.json"

    def _pending_path(self, partition: int, producer_id: int) -> Path:
        return self.pending_dir / str(partition) / f"{producer_id}{SUFFIX}"

    def _pending_entry(self, partition: int, producer_id: int) -> OffsetsProducer | None:
        """What offsets partition `partition` keeps of the producer. From memory, unless shared
        and another broker wrote the file since, or a failure cut the log: then from the file."""
        current = self._pending_logs.get((partition, producer_id))
        known = self._producers.get(producer_id, {}).get(partition)
        if current is not None and not current.offline:
            if not self.shared:
                return known
            try:
                st = os.stat(current.path)
                if st.st_ino == current.inode and st.st_size == current.end:
                    return known
            except FileNotFoundError:
                pass
        elif current is None and not self.shared:
            return known   # (every file was read at open)
        return self._load_pending(partition, producer_id)

    def _load_pending(self, partition: int, producer_id: int) -> OffsetsProducer | None:
        """The producer's state on `partition` read from its files (its log, or a JSON file of
        before logs)."""
        key = (partition, producer_id)
        current = self._pending_logs.pop(key, None)
        if current is not None:
            current.closed = True
        try:
            log_, values = RecordLog.load(self._pending_path(partition, producer_id))
        except FileNotFoundError:
            try:
                entry: OffsetsProducer | None = self._read_entry(self._entry_path(partition, producer_id))
            except FileNotFoundError:
                entry = None
        else:
            log_.guard = self._partition_guard(partition)
            self._pending_logs[key] = log_
            entry = _producer_from(values)
        if entry is None:
            self._forget_producer(partition, producer_id)
        else:
            self._producers.setdefault(producer_id, {})[partition] = entry
        return entry

    def pending_log(self, partition: int, producer_id: int) -> RecordLog | None:
        """The producer's log of pending offsets on `partition` as this broker last wrote it."""
        return self._pending_logs.get((partition, producer_id))

    def _partition_guard(self, partition: int) -> Callable[[], AbstractContextManager[None]]:
        return lambda: self._writing(partition)

    def _forget_producer(self, partition: int, producer_id: int) -> None:
        parts = self._producers.get(producer_id, {})
        parts.pop(partition, None)
        if not parts:
            self._producers.pop(producer_id, None)

    def add_pending(self, producer_id: int, producer_epoch: int, group: str,
                    offsets: Mapping[tuple[str, int], Committed], now_ms: int, sync: bool = True,
                    frames: Sequence[Frame] | None = None) -> int:
        """A TxnOffsetCommit's offsets, pending on the group's offsets partition: their records
        (and the producer's) appended to the producer's log there, and only theirs; durable
        (fsynced) before it returns NONE, unless `sync=False` (then nobody is answered before
        the group commit covered `pending_log(...).writes`). INVALID_PRODUCER_EPOCH for an epoch
        older than that partition knows of the producer. `frames`: `pending_frames(group, offsets)`."""
        partition = self.partition_of(group)
        with self._writing(partition):
            code, _message, entry = add_offsets(self._pending_entry(partition, producer_id), producer_epoch, group,
                                                offsets, now_ms)
            if entry is None:
                return code
            log_ = self._pending_logs.get((partition, producer_id))
            if log_ is None:
                if self._entry_path(partition, producer_id).exists():   # a JSON file of before: whole
                    self._write_entry(partition, producer_id, entry)
                    return code
                log_ = self._new_pending_log(partition, producer_id)
            log_.append_frames([(_PRODUCER, frame_payload(_PRODUCER, json.dumps(_producer_json(entry))), False),
                                *(frames if frames is not None else pending_frames(group, offsets.items()))],
                               self.shared, sync)
            self._producers.setdefault(producer_id, {})[partition] = entry
            if sync and log_.due():
                log_.compact()
            return code

    def _new_pending_log(self, partition: int, producer_id: int) -> RecordLog:
        """An empty log (durable with its first append's fsync, which fsyncs its directory)."""
        path = self._pending_path(partition, producer_id)
        new_dirs = []
        if not path.parent.exists():
            path.parent.mkdir(exist_ok=True)
            new_dirs.append(self.pending_dir)   # its entry, fsynced with the log's first append
        try:
            log_ = RecordLog.create_empty(path, new_dirs)
        except FileExistsError:   # a leftover nobody reads (this broker found none): replaced
            log_ = RecordLog.create_whole(path, ())
        log_.guard = self._partition_guard(partition)
        self._pending_logs[(partition, producer_id)] = log_
        return log_

    def apply_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                     partition: int, now_ms: int, transaction_version: int = 0) -> tuple[int, str | None]:
        """The transaction's marker on `__consumer_offsets-<partition>`, checked as a data
        partition checks it (`core.txn.offsets.take_marker`); only a marker taken settles the
        producer's pending offsets there: COMMIT commits them to their groups (appended to their
        offset logs, fsynced), ABORT drops them. The producer's log is rewritten last (whole: its
        record alone), so a marker repeated after a crash finds what is left. Returns (code, why
        refused)."""
        with self._writing(partition):
            code, message, entry, settled = take_marker(self._pending_entry(partition, producer_id), producer_id,
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
            entries = sorted(self._pending_keys())
        else:
            entries = [(p, pid) for pid, parts in self._producers.items() for p in parts]
        for partition, pid in entries:
            if not self.owns(partition):
                continue
            with self._writing(partition):
                entry = self._pending_entry(partition, pid)
                if entry is not None and expired(entry, now_ms, expiration_ms):
                    self._write_entry(partition, pid, None)
                    removed += 1
        return removed

    def _write_entry(self, partition: int, producer_id: int, entry: OffsetsProducer | None) -> None:
        """The producer's state on `partition` written whole (its log replaced, durably; None:
        its files removed). An append of it still waiting for its fsync is answered as durable:
        the new file holds what it wrote (or settled it)."""
        key = (partition, producer_id)
        legacy = self._entry_path(partition, producer_id)
        current = self._pending_logs.get(key)
        if entry is None:
            self._forget_producer(partition, producer_id)
            if current is not None:
                current.closed = True
                del self._pending_logs[key]
            _unlink(self._pending_path(partition, producer_id))
            _unlink(legacy)
            return
        records = [(_PRODUCER, _producer_json(entry)), *((_pending_key(group, tp), _pending_json(group, tp, c))
                                                         for group, offsets in sorted(entry.pending.items())
                                                         for tp, c in offsets.items())]
        if current is not None and not current.offline:
            current.write_whole(framed(records))
        else:
            path = self._pending_path(partition, producer_id)
            if not path.parent.exists():
                path.parent.mkdir(exist_ok=True)
                fsync_dir(self.pending_dir)
            if current is not None:
                current.closed = True
            current = self._pending_logs[key] = RecordLog.create_whole(path, records)
            current.guard = self._partition_guard(partition)
        self._producers.setdefault(producer_id, {})[partition] = entry
        _unlink(legacy)   # (after the log is durable: a crash between leaves both, and the log wins)

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
                    if not (self._entry_path(partition, int(path.stem)).exists()
                            or self._pending_path(partition, int(path.stem)).exists()):
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


def _offset_key(tp: tuple[str, int]) -> Key:
    # the id is only compared: unique whatever the topic's name holds (the partition has no ':')
    return "offset", f"{tp[1]}:{tp[0]}"


def _offset_text(tp: tuple[str, int], c: Committed) -> str:
    """`_offset_json` written as JSON text by hand (a commit of 2,000 offsets spent 40 ms in
    json.dumps on the event loop)."""
    return (f'{{"topic":{_quote(tp[0])},"partition":{tp[1]},"offset":{c.offset},'
            f'"metadata":{"null" if c.metadata is None else _quote(c.metadata)},"leader_epoch":{c.leader_epoch},'
            f'"commit_timestamp":{c.commit_timestamp},"expire_timestamp":{c.expire_timestamp}}}')


def _offset_frame(key: Key, text: str) -> Frame:
    return key, frame_payload(key, text), False


def offset_frames(offsets: Iterable[tuple[tuple[str, int], Committed]]) -> list[Frame]:
    """The records of committed offsets, framed (pure: a caller may make them in parts, between
    other work, and hand them to `commit`)."""
    return [_offset_frame(_offset_key(tp), _offset_text(tp, c)) for tp, c in offsets]


def pending_frames(group: str, offsets: Iterable[tuple[tuple[str, int], Committed]]) -> list[Frame]:
    """The records of a group's pending transactional offsets, framed (as `offset_frames`)."""
    prefix = f'{{"group":{_quote(group)},'
    return [_offset_frame(_pending_key(group, tp), prefix + _offset_text(tp, c)[1:]) for tp, c in offsets]


_quote = json.encoder.encode_basestring_ascii   # a JSON string literal (C)


def _offset_json(tp: tuple[str, int], c: Committed) -> dict[str, Any]:
    """Kafka's OffsetCommit record's value, with its key's topic and partition."""
    return {"topic": tp[0], "partition": tp[1], "offset": c.offset, "metadata": c.metadata,
            "leader_epoch": c.leader_epoch, "commit_timestamp": c.commit_timestamp,
            "expire_timestamp": c.expire_timestamp}


def _committed(v: dict[str, Any]) -> Committed:
    return Committed(v["offset"], v.get("metadata"), v.get("leader_epoch", -1), v.get("commit_timestamp", -1),
                     v.get("expire_timestamp", -1))


def _pending_key(group: str, tp: tuple[str, int]) -> Key:
    # unique whatever the names hold: the partition has no ':', the topic's length delimits it
    return "pending", f"{tp[1]}:{len(tp[0])}:{tp[0]}:{group}"


def _pending_json(group: str, tp: tuple[str, int], c: Committed) -> dict[str, Any]:
    return {"group": group, **_offset_json(tp, c)}


def _producer_json(p: OffsetsProducer) -> dict[str, Any]:
    return {"epoch": p.epoch, "coordinator_epoch": p.coordinator_epoch, "updated_ms": p.updated_ms}


def _producer_from(values: Mapping[Key, Any]) -> OffsetsProducer | None:
    """What a producer's log of pending offsets holds (None: nothing, not even its record)."""
    state = values.get(_PRODUCER)
    pending: dict[str, dict[tuple[str, int], Committed]] = {}
    for (kind, _id), v in values.items():
        if kind == "pending":
            pending.setdefault(v["group"], {})[(v["topic"], v["partition"])] = _committed(v)
    if state is None and not pending:
        return None
    state = state or {}
    return OffsetsProducer(state.get("epoch", -1), state.get("coordinator_epoch", -1), state.get("updated_ms", -1),
                           pending)


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
