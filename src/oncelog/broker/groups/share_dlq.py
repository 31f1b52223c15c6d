"""Dead-letter topics of share groups (KIP-1191, Kafka 4.4 behind `share.version=2`): the records a
share group's consumers REJECT, and those archived at `group.share.delivery.count.limit`, written
to the group's dead-letter topic, once each.

When it applies: the cluster's `share.version` is finalized at 2 and the group's
`errors.deadletterqueue.topic.name` names a topic (`enabled`). Then such a record goes ARCHIVING
with a dead letter in its share-partition (`core.share.partition`), in the same state write as
the acknowledgement or the lock expiry that ended it; once that write is on disk, this writes its
dead-letter record, and the record becomes ARCHIVED. Each write checks the topic as Kafka's
`ShareGroupDLQValidator` does, in its order: the name does not start with `__`; a topic that
exists has `errors.deadletterqueue.group.enable=true` (its administrator's consent: the broker
writes it as itself, so a group's configs must not turn it into a way to write to any topic);
the name has the cluster's `errors.deadletterqueue.topic.name.prefix` (`dlq.`); a topic that does
not exist is created (with the consent set) only under
`errors.deadletterqueue.auto.create.topics.enable`. A topic that fails a check refuses the
dead letters: their records are ARCHIVED without a dead-letter record, as Kafka gives them up,
and counted (`dead_letter_failed`). A write that fails for a passing reason (the disk, a
dead-letter partition this broker does not lead, the group's state write) is tried again, with a
growing pause, and its records stay ARCHIVING meanwhile: never lost.

The record: written to the partition `source partition % partitions of the topic`, stamped with
the wall clock, with Kafka's headers `__dlq.errors.topic`, `__dlq.errors.partition`,
`__dlq.errors.offset`, `__dlq.errors.group`, `__dlq.errors.delivery.count` and
`__dlq.errors.message` ("Offset rejected by client." or "Offset delivery count exceeded the
threshold."), and, with `errors.deadletterqueue.copy.record.enable=true`, the original key and
value (as Kafka's ShareGroupDLQRecordHelper copies them; not the original headers), when the log
still has the record.

Exactly once, where Kafka says it may write twice ("the broker does not guarantee to write the
DLQ record onto the DLQ topic atomically with the associated write to the internal share-group
state topic"): every share-partition writes its dead letters as an idempotent producer of its
own (a producer id from the controller's blocks, KIP-730, kept in its state), each dead letter
with the sequence it was given when its record went ARCHIVING. Before a write, the dead-letter
partition's producer state says how far that producer got: dead letters up to its last sequence
are in the log already (written before a crash or a pause, and not yet marked) and are only
marked, once the batches the partition remembers for the producer are read and have them (their
headers: the producer id is in every dead-letter batch's header and a Produce may carry any id, so
a client writing to the topic could otherwise advance the sequences and have dead letters marked
that were never written; if they are not there, a new producer writes them); the rest are
appended, and a batch written twice is a duplicate the partition refuses.
A record goes ARCHIVED only once its dead-letter record is fsynced (a power cut keeps no mark
without its record), and a dead letter is written only once the state write that made it is on
disk (a crash cannot leave a dead-letter record for a record that comes back). Each producer
epoch writes to one dead-letter partition; a new target (the group's topic changed, or grew) or a
gap in the sequences (dead letters given up) starts a new epoch, written to the state and on disk
before its first record. Only the group's coordinator writes: a broker that lost the group's lease
(`broker.groups.ownership`) drops the group before its next write, and one paused mid-write writes
a batch the new owner's writes then find (the same producer, epoch and sequences).

Bounded work: at most `ROUND_RECORDS` dead letters and `ROUND_READ_BYTES` of source records per
write, one write in flight per share-partition, and ARCHIVING records hold the share-partition's
start back, so its dead letters never outnumber `group.share.partition.max.record.locks`,
whatever a client rejects.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oncelog.broker.groups.share_groups import DLQ_COPY_RECORD, DLQ_TOPIC_NAME, SpKey
from oncelog.core.features import SHARE_VERSION, SHARE_VERSION_DLQ
from oncelog.core.log_limit import LogLimit, held_back
from oncelog.core.share.partition import DEAD_LETTER_REASONS, MAX_SEQUENCE, DeadLetter, SharePartition
from oncelog.core.topic_names import is_internal
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.records import encode_batch, iter_record_batches, record_size_upper_bound

if TYPE_CHECKING:
    from oncelog.broker.services import BrokerServices
    from oncelog.storage.partition import Partition

log = logging.getLogger(__name__)
E = ErrorCode

HEADER_TOPIC = "__dlq.errors.topic"
HEADER_PARTITION = "__dlq.errors.partition"
HEADER_OFFSET = "__dlq.errors.offset"
HEADER_GROUP = "__dlq.errors.group"
HEADER_DELIVERY_COUNT = "__dlq.errors.delivery.count"
HEADER_MESSAGE = "__dlq.errors.message"
TOPIC_ENABLE = "errors.deadletterqueue.group.enable"            # the topic's consent
AUTO_CREATE = "errors.deadletterqueue.auto.create.topics.enable"
TOPIC_PREFIX = "errors.deadletterqueue.topic.name.prefix"

ROUND_RECORDS = 500                # dead letters one write takes at most
COPY_READ_BYTES = 1 << 20          # one read for a source record (Kafka's DLQ_MAX_FETCH_BYTES)
ROUND_READ_BYTES = 4 << 20         # source bytes one write reads at most (copy.record.enable)
ROUNDS_PER_RUN = 50                # then the share-partition waits for the next tick
SCAN_MS = 5000                     # how often stored groups are looked at for dead letters owed
RETRY_MS, RETRY_MAX_MS = 100, 5000
MAX_EPOCH = 2**15 - 1
BATCH_OVERHEAD = 61
# a write the dead-letter partition refuses for what it is: its dead letters are given up
_REFUSED_BATCH = {E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE, E.INVALID_RECORD, E.CORRUPT_MESSAGE,
                  E.UNSUPPORTED_FOR_MESSAGE_FORMAT, E.INVALID_TOPIC_EXCEPTION, E.POLICY_VIOLATION}


class Refused(Exception):
    """The group's dead-letter topic cannot take its dead letters (a check of KIP-1191 fails):
    they are given up."""


class NotNow(Exception):
    """A write failed for a passing reason: tried again later."""


@dataclass(frozen=True)
class Target:
    topic: str
    topic_id: str
    partition: int
    copy: bool


class ShareDeadLetters:
    """The dead-letter writer of one broker's share groups (`Broker.share_dlq`)."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker
        self._running: dict[SpKey, asyncio.Task] = {}
        # key -> (not before, last pause ms); monotonic time: a pause of the process, not of the log
        self._retry: dict[SpKey, tuple[float, int]] = {}
        self._log_limit = LogLimit(burst=5, period_s=60.0)
        self._scanned: set[str] = set()   # groups whose stored dead letters were looked at here
        self._next_scan = 0.0
        self.closed = False
        share = broker.groups.share
        share.dead_letter = self.enabled
        share.on_durable = self.kick

    # ------------------------------------------------------------------ when
    def enabled(self, group: str) -> bool:
        """Whether `group` has a dead-letter topic now: `share.version` 2 and a topic named."""
        try:
            level = self.broker.security.state.features.level(SHARE_VERSION)
        except Exception:   # noqa: BLE001 - before the broker has followed the controller: the default
            return False
        return level >= SHARE_VERSION_DLQ and bool(self.broker.groups.share.group_config(group, DLQ_TOPIC_NAME).strip())

    def pending(self) -> int:
        """Dead letters not yet written, over every share-partition of this broker (a metric)."""
        return sum(len(sp.dead_letters()) for sp in self.broker.groups.share.partitions.values())

    def kick(self, group: str | None = None) -> None:
        """Write what the share-partitions of `group` (all: None) owe, unless a write of theirs is
        under way or waits to be tried again."""
        if self.closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return   # no event loop (the broker's last state write at its stop): the next start writes them
        now = time.monotonic()
        for key, sp in list(self.broker.groups.share.partitions.items()):
            if (group is not None and key[0] != group) or not sp.dead_letters() or key in self._running:
                continue
            retry = self._retry.get(key)
            if retry is not None and retry[0] > now:
                continue
            self._running[key] = asyncio.create_task(self._run(key, sp), name=f"share-dlq {key[0]}")

    def tick(self) -> None:
        """The broker's tick: writes to try again, and the dead letters a restart (or a group
        coming to this broker) found in the groups' state."""
        partitions = self.broker.groups.share.partitions
        for key in [k for k in self._retry if k not in partitions]:
            del self._retry[key]
        now = time.monotonic()
        if now >= self._next_scan:
            self._next_scan = now + SCAN_MS / 1000
            try:
                self._load_owed()
            except OSError as e:
                self._say(logging.WARNING, "share groups' dead letters not looked at now: %s", e)
        self.kick()

    def _load_owed(self) -> None:
        """Load the share-partitions whose stored state owes dead letters (a share-partition is
        otherwise loaded by its first ShareFetch: a restart must not wait for a consumer to write
        what a crash left unwritten)."""
        share, logs = self.broker.groups.share, self.broker.logs
        self._scanned = {g for g in self._scanned if self.broker.coordinates(g)}
        for group in share.store.groups():
            if group in self._scanned or not self.broker.coordinates(group):
                continue
            self._scanned.add(group)
            for topic_id, index in list(share.store.partitions(group)):
                if (group, topic_id, index) in share.partitions:
                    continue
                state = share.store.read(group, topic_id, index)
                if state is None or state.dead_letters is None or not state.dead_letters.pending:
                    continue
                name = logs.topic_name(topic_id)
                partition = logs.get_partition(name, index) if name is not None else None
                if partition is None:
                    self._scanned.discard(group)   # not led here (yet): looked at again
                    continue
                share.share_partition(group, topic_id, index, partition.log_start_offset, partition.high_watermark)
                log.info("share group %s: %s-%d owes %d dead letters; writing them", group, name, index,
                         len(state.dead_letters.pending))

    async def close(self) -> None:
        self.closed = True
        tasks = list(self._running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()

    # ------------------------------------------------------------------ a share-partition's writes
    async def _run(self, key: SpKey, sp: SharePartition) -> None:
        try:
            for _ in range(ROUNDS_PER_RUN):
                if not await self._round(key, sp):
                    break
            self._retry.pop(key, None)
        except NotNow as e:
            _, pause = self._retry.get(key, (0, 0))
            pause = min(RETRY_MAX_MS, max(RETRY_MS, pause * 2))
            self._retry[key] = (time.monotonic() + pause / 1000, pause)
            self._say(logging.WARNING, "share group %s: dead letters of %s-%d not written now (%s); tried again "
                      "in %d ms", key[0], self._source_name(key), key[2], e, pause)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("share group %s: writing the dead letters of %s-%d failed; tried again later",
                          key[0], self._source_name(key), key[2])
            self._retry[key] = (time.monotonic() + RETRY_MAX_MS / 1000, RETRY_MAX_MS)
        finally:
            if self._running.get(key) is asyncio.current_task():
                del self._running[key]

    async def _round(self, key: SpKey, sp: SharePartition) -> bool:
        """One write of the share-partition's dead letters (or one step towards it): whether to go
        on at once."""
        group = key[0]
        share = self.broker.groups.share
        if not sp.dead_letters():
            return False
        # the records' move to ARCHIVING (with their dead letters) is on disk before any is written
        # (0: nothing written since the group was loaded, which read them from the disk)
        covering = share.covering_write(group)
        error = await share.durable(group, covering) if covering else None
        if error is not None:
            raise NotNow(f"the group's state write failed: {error}")
        if not self._still(key, sp) or not sp.dead_letters():
            return False
        if not self.enabled(group):
            self._give_up(key, sp, None, "the group has no dead-letter topic now (errors.deadletterqueue.topic.name "
                                         "removed, or share.version below 2)")
            return False
        try:
            target = await self._target(group, key[2])
        except Refused as e:
            self._give_up(key, sp, None, str(e))
            return False
        if not self._still(key, sp):
            return False
        if sp.dlq_producer_id < 0 or sp.dlq_target != (target.topic_id, target.partition):
            await self._new_epoch(key, sp, target, "a new dead-letter partition")
            return True
        partition = self.broker.logs.get_partition(target.topic, target.partition)
        if partition is None:
            raise NotNow(f"{target.topic}-{target.partition}: "
                         f"{self.broker.logs.partition_error(target.topic, target.partition).name}")
        pid, epoch = sp.dlq_producer_id, sp.dlq_producer_epoch
        head = sp.dead_letters()[0]
        entry = partition.producer_state.entry(pid)
        if entry is not None and entry.epoch > epoch:
            # only a later owner of this share-partition writes with a later epoch, and it wrote its
            # epoch to the state before that: ours is a copy from before; start above it
            log.warning("share group %s: %s-%d already has producer %d at epoch %d above this broker's %d",
                        group, target.topic, target.partition, pid, entry.epoch, epoch)
            await self._new_epoch(key, sp, target, "a later epoch in the dead-letter partition", entry.epoch + 1)
            return True
        if entry is not None and entry.epoch == epoch and entry.last_sequence >= head.sequence:
            # in the log already: written before a crash (or by this broker paused before it lost the
            # group, its successor's write refused as a duplicate), not yet marked -- if the log has
            # them as this share-partition's: the producer id is in every dead-letter batch's header
            # and a Produce may carry any id, so a client writing to the topic could advance its
            # sequences and have dead letters marked that were never written
            found = self._in_log(key, sp, partition, entry.batches)
            if found < head.sequence:
                self._say(logging.WARNING, "share group %s: %s-%d has sequences of dead-letter producer %d "
                          "epoch %d that are not this share-partition's dead letters (a client wrote under its "
                          "id): its dead letters go out as a new producer", group, target.topic, target.partition,
                          pid, epoch)
                sp.dlq_producer_id = -1
                await self._new_epoch(key, sp, target, "a client wrote under the dead-letter producer id")
                return True
            await self._durable(partition, partition.log_end_offset)
            self._written(key, sp, found)
            return True
        expected = 0 if entry is None or entry.epoch < epoch else entry.last_sequence + 1
        if head.sequence != expected:
            # a gap: dead letters given up, or the producer's state gone from the partition (expired)
            await self._new_epoch(key, sp, target, f"sequence {head.sequence} does not follow {expected - 1}")
            return True
        batch, count = self._batch(key, sp, target, partition)
        if head.sequence + count - 1 > MAX_SEQUENCE:
            await self._new_epoch(key, sp, target, "the sequences ran out")
            return True
        if not self.broker.coordinates(group) or not self._still(key, sp):
            return False   # the group's lease was lost: its new owner writes them
        result = partition.append_from_client(batch, self.broker.now_ms())
        code = result.error_code
        if code in (E.NONE, E.DUPLICATE_SEQUENCE_NUMBER):
            self.broker.data_appended()
            await self._durable(partition, partition.log_end_offset)
            self._written(key, sp, head.sequence + count - 1)
            return True
        if code in (E.OUT_OF_ORDER_SEQUENCE_NUMBER, E.UNKNOWN_PRODUCER_ID, E.INVALID_PRODUCER_EPOCH):
            return True   # the next round reads the partition's producer state again
        if code in _REFUSED_BATCH:
            self._give_up(key, sp, count, f"{target.topic}-{target.partition} refused the write: "
                                          f"{E(code).name} ({result.error_message})")
            return True
        raise NotNow(f"{target.topic}-{target.partition}: {E(code).name} ({result.error_message})")

    async def _target(self, group: str, source_partition: int) -> Target:
        """The group's dead-letter topic checked as Kafka checks it, created if it may be."""
        share, logs = self.broker.groups.share, self.broker.logs
        name = share.group_config(group, DLQ_TOPIC_NAME).strip()
        copy = share.group_config(group, DLQ_COPY_RECORD).strip().lower() == "true"
        if name.startswith("__") or is_internal(name):
            raise Refused(f"Configured DLQ topic name in share group: {group} cannot start with __, topic: {name}.")
        info = logs.topics.get(name)
        if info is not None and not logs.topic_config(name).get(TOPIC_ENABLE):
            raise Refused(f"DLQ is not enabled on configured DLQ topic for share group: {group}, topic: {name}")
        prefix = str(self.broker.dynamic_config.value(TOPIC_PREFIX) or "").strip()
        if prefix and not name.startswith(prefix):
            raise Refused(f"Configured DLQ topic name does not comply with the DLQ topic prefix in share group: "
                          f"{group}, topic: {name}, prefix: {prefix}")
        if info is None:
            if not self.broker.dynamic_config.value(AUTO_CREATE):
                raise Refused(f"DLQ topic does not exist and auto create is disabled on cluster for share group: "
                              f"{group}, topic: {name}.")
            try:
                info = await logs.create_topic(name, self.broker.config["num.partitions"], {TOPIC_ENABLE: "true"},
                                               self.broker.now_ms())
                log.info("share group %s: created its dead-letter topic %s (%d partitions)", group, name,
                         info.partitions)
            except KafkaProtocolError as e:
                if e.code != E.TOPIC_ALREADY_EXISTS:
                    raise NotNow(f"creating {name}: {e}") from None
                found = logs.topics.get(name)
                if found is None:
                    raise NotNow(f"{name} is being created") from None
                info = found
        return Target(name, str(info.topic_id), source_partition % info.partitions, copy)

    async def _new_epoch(self, key: SpKey, sp: SharePartition, target: Target, why: str,
                         at_least: int = 0) -> None:
        """Start a new producer epoch (a new producer the first time, or when the epochs ran out)
        writing to `target`, the pending dead letters numbered from 0: on disk before its first
        write, so that a restart writes with the same producer, epoch and sequences."""
        share = self.broker.groups.share
        pid, epoch = sp.dlq_producer_id, max(sp.dlq_producer_epoch + 1, at_least)
        if pid < 0 or epoch > MAX_EPOCH:
            try:
                pid, epoch = await self.broker.producer_ids.generate_producer_id(), 0
            except KafkaProtocolError as e:
                raise NotNow(f"no producer id yet: {e}") from None
            if not self._still(key, sp) or not sp.dead_letters():
                return
        sp.renumber(pid, epoch, (target.topic_id, target.partition))
        n = share.changed(key)
        share.flush(key[0])
        log.info("share group %s: dead letters of %s-%d go to %s-%d as producer %d epoch %d (%s)", key[0],
                 self._source_name(key), key[2], target.topic, target.partition, pid, epoch, why)
        error = await share.durable(key[0], n)
        if error is not None:
            raise NotNow(f"the group's state write failed: {error}")

    def _batch(self, key: SpKey, sp: SharePartition, target: Target, partition: Partition) -> tuple[bytes, int]:
        """The next dead letters as one idempotent batch: (its bytes, how many)."""
        group, topic_id, index = key
        source_name = self._source_name(key)
        source = self.broker.logs.get_partition(source_name, index) if target.copy else None
        copies: dict[int, tuple[bytes | None, bytes | None]] = {}
        read = 0
        limit = max(1024, partition.log.config.max_message_bytes)
        size = BATCH_OVERHEAD
        now = self.broker.now_ms()
        records: list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]] = []
        for d in sp.dead_letters()[:ROUND_RECORDS]:
            key_value: tuple[bytes | None, bytes | None] = (None, None)
            if source is not None:
                if d.offset not in copies and read < ROUND_READ_BYTES:
                    read += _read_source(source, d.offset, copies)
                elif d.offset not in copies and records:
                    break   # this write read enough: the next one copies the rest
                key_value = copies.get(d.offset, (None, None))
            headers = _headers(source_name, index, group, d)
            grown = record_size_upper_bound(key_value[0], key_value[1], headers)
            if records and size + grown > limit:
                break
            size += grown
            records.append((len(records), now, key_value[0], key_value[1], headers))
        batch = encode_batch(records, producer_id=sp.dlq_producer_id, producer_epoch=sp.dlq_producer_epoch,
                             base_sequence=sp.dead_letters()[0].sequence)
        return bytes(batch), len(records)

    def _in_log(self, key: SpKey, sp: SharePartition, partition: Partition,
                batches: tuple[tuple[int, int, int, int], ...]) -> int:
        """The last sequence up to which the owed dead letters are in `partition`'s log as this
        share-partition's records (their `__dlq.errors.*` headers), read from the producer's
        batches the partition remembers (first sequence, last sequence, base offset, timestamp);
        below the head's sequence: not found."""
        group, _tid, index = key
        source_name = self._source_name(key)
        owed = sp.dead_letters()
        found = owed[0].sequence - 1
        for d in owed:
            at = next((base + d.sequence - first for first, last, base, _ts in batches if first <= d.sequence <= last),
                      None)
            if at is None:
                break
            try:
                data = partition.read(at, COPY_READ_BYTES, min_one=True)
                record = next((r for _h, rs in iter_record_batches(data) for r in rs if r.offset == at), None)
            except (KafkaProtocolError, OSError, ValueError):
                break
            want = {k: v for k, v in _headers(source_name, index, group, d) if k != HEADER_MESSAGE}
            if record is None or {k: v for k, v in record.headers if k in want} != want:
                break
            found = d.sequence
        return found

    async def _durable(self, partition: Partition, offset: int) -> None:
        """A record goes ARCHIVED only once its dead-letter record is fsynced."""
        if partition.write_caching:
            self.broker.group_commit.appended(partition)
            return
        waiting = self.broker.group_commit.durable(partition, offset)
        if waiting is not None and not await waiting:
            raise NotNow(f"{partition.topic}-{partition.index}: the fsync failed")

    def _written(self, key: SpKey, sp: SharePartition, last_sequence: int) -> None:
        if not self._still(key, sp):
            return
        if sp.dead_lettered(last_sequence):
            self.broker.groups.share.changed(key)
            self.broker.groups.share.flush(key[0])

    def _give_up(self, key: SpKey, sp: SharePartition, count: int | None, why: str) -> None:
        n = sp.drop_dead_letters(count)
        if n:
            self.broker.groups.share.changed(key)
            self.broker.groups.share.flush(key[0])
            self._say(logging.ERROR, "share group %s: %d records of %s-%d archived without their dead-letter "
                      "records: %s", key[0], n, self._source_name(key), key[2], why)

    def _still(self, key: SpKey, sp: SharePartition) -> bool:
        """The share-partition is still the one this broker holds (not unloaded, not deleted)."""
        return self.broker.groups.share.partitions.get(key) is sp

    def _source_name(self, key: SpKey) -> str:
        return self.broker.logs.topic_name(key[1]) or str(key[1])

    def _say(self, level: int, message: str, *args: object) -> None:
        write, held = self._log_limit.allow(time.monotonic())
        if write:
            log.log(level, message + held_back(held, self._log_limit.period_s), *args)


def _headers(topic: str, partition: int, group: str, d: DeadLetter) -> tuple[tuple[str, bytes], ...]:
    return ((HEADER_TOPIC, topic.encode()), (HEADER_PARTITION, str(partition).encode()),
            (HEADER_OFFSET, str(d.offset).encode()), (HEADER_GROUP, group.encode()),
            (HEADER_DELIVERY_COUNT, str(d.delivery_count).encode()),
            (HEADER_MESSAGE, DEAD_LETTER_REASONS.get(d.reason, "").encode()))


def _read_source(source: Partition, offset: int, into: dict[int, tuple[bytes | None, bytes | None]]) -> int:
    """Read the source log from `offset` (one batch at least, COPY_READ_BYTES at most) and keep the
    key and value of every record read; the bytes read. A record the log no longer has (retention,
    compaction) is not found: its dead-letter record carries the headers only, as Kafka's does."""
    into.setdefault(offset, (None, None))
    try:
        data = source.read(offset, COPY_READ_BYTES, min_one=True)
        for header, records in iter_record_batches(data):
            if not header.is_control:
                for r in records:
                    into[r.offset] = (r.key, r.value)
    except (KafkaProtocolError, OSError, ValueError) as e:
        log.warning("the record at offset %d of %s-%d is not copied to its dead-letter record: %s", offset,
                    source.topic, source.index, e)
        return 0
    return len(data)
