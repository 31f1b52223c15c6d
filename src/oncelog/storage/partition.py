"""One partition as the broker sees it: validate a produced record set, deduplicate, append, read.

`append_from_client` is prepare -> append -> commit: the producer state decides without changing
anything, the log appends whole batches, and only then does the state record the batch. A
duplicate is answered with the original offset and timestamp and appends nothing.

A storage failure that cuts records off the log (a failed fsync: `PartitionLog._sync_failed`)
rebuilds producer state from snapshot + log before anything else is decided, so the state never
remembers a batch the log lost, and a retry of that batch is appended (once) instead of being
answered as a duplicate of nothing.

Producer state follows the log: a snapshot at every segment roll and at clean shutdown; on open the
newest readable snapshot is loaded (a corrupt one is set aside with a log line and an older one is
tried: `storage.producer_state_store`, which owns the snapshot files) and the log above it is
replayed. State outlives the segments that wrote it, as in Kafka: only `producer.id.expiration.ms`
removes producers.

Over 600 lines, one concern: the design's rule that producer state never disagrees with the log.
Every path that changes either is here, so that each keeps them in step: appends and markers
(prepare -> append -> commit), cuts after a failed fsync and truncations (rebuild), recovery
(snapshot + replay), restores of expired producers and the older-duplicate lookup (state read
back from the log). The verdicts are `core.producer_state`'s, the bytes `storage.log`'s, the
snapshot files `storage.producer_state_store`'s.

In a cluster on one machine a partition is owned under a lease (`storage.fence`): every write —
appends, markers, truncations, retention, snapshots, compaction swaps — happens under the lease's
lock after its token is checked, so a broker deposed while it was paused writes nothing once a
newer leader raised the token; it is answered NOT_LEADER_OR_FOLLOWER, and `fenced` tells the
broker to drop the partition (`drop`: its files closed, nothing written).
"""
from __future__ import annotations

import logging
import secrets
import time
from array import array
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from oncelog.core import producer_state as ps
from oncelog.core.compaction import LastBatch, keyless_records
from oncelog.core.producer_state import ProducerStateConfig, ProducerStateManager
from oncelog.core.sequence import distance_below, last_sequence_of
from oncelog.core.txn.partition import AbortedQuery, PartitionTxns, collect_aborted
from oncelog.core.txn.state import TV_2
from oncelog.core.txn.verification import Guard, VerificationGuards
from oncelog.protocol import compression
from oncelog.protocol import records as rec
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import Buf
from oncelog.protocol.records import message_format_magic
from oncelog.storage import txn_index
from oncelog.storage.fence import Busy, Fenced, Lease
from oncelog.storage.log import LogConfig, PartitionLog, SyncToken
from oncelog.storage.producer_state_store import ProducerStateStore
from oncelog.storage.segment import FileRegion, Segment

log = logging.getLogger(__name__)

DEFAULT_EXPIRATION_CHECK_INTERVAL_MS = 600_000  # Kafka's producer.id.expiration.check.interval.ms


@dataclass(slots=True)
class AppendResult:
    error_code: int = 0
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    # "producer_state_batches_to_retain" (ProduceResponse v14 tag 1, always),
    # "max_in_flight_sequence_number" (tag 10000, range-mode topics only, else None),
    # "duplicate" (the duplicate kind when the answer came from producer state).
    extra: dict[str, Any] = field(default_factory=dict)
    last_offset: int = -1  # the answered batch's last offset (appended or original): acks=all waits for it
    record_errors: list[tuple[int, str | None]] = field(default_factory=list)  # (record index, message)


@dataclass(slots=True)
class ProducerStateCounters:
    """Monotonic counts, exposed with the gauges by `Partition.producer_state_stats`."""
    duplicates_latest: int = 0    # retry of the producer's latest batch, answered with its offset
    duplicates_window: int = 0    # an older retained batch, answered with its offset
    duplicates_tail: int = 0      # found by the log-tail lookup, answered with its offset
    duplicates_sequence: int = 0  # range mode, offset unknown: DUPLICATE_SEQUENCE_NUMBER
    out_of_order: int = 0         # OUT_OF_ORDER_SEQUENCE_NUMBER answers
    unknown_producer: int = 0     # UNKNOWN_PRODUCER_ID answers
    restored: int = 0             # remembered producers restored from the log (their batches' headers)
    invalid_epoch: int = 0        # INVALID_PRODUCER_EPOCH answers
    unsupported_format: int = 0   # idempotent produce to a topic below message format v2
    expirations: int = 0          # producers removed by producer.id.expiration.ms
    snapshots_written: int = 0
    snapshots_set_aside: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_ERROR_COUNTER: dict[int, str] = {
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: "out_of_order",
    ErrorCode.UNKNOWN_PRODUCER_ID: "unknown_producer",
    ErrorCode.INVALID_PRODUCER_EPOCH: "invalid_epoch",
    ErrorCode.DUPLICATE_SEQUENCE_NUMBER: "duplicates_sequence",
}


def _topic_codec(compression_type: str) -> int | None:
    """The codec number batches are stored under, or None to keep the producer's."""
    if compression_type == "producer":
        return None
    return compression.codec_for_name("none" if compression_type == "uncompressed" else compression_type)


@dataclass(frozen=True)
class PartitionConfig:
    """Everything a partition is configured with: its log's settings and its producer state's,
    read from the topic's Kafka-named configs in one place."""
    log: LogConfig
    producer_state: ProducerStateConfig

    @classmethod
    def from_topic_config(cls, config: Mapping[str, Any]) -> PartitionConfig:
        """From `core.topic_config.effective_topic_config` plus the broker's producer settings."""
        return cls(LogConfig.from_topic_config(config), ProducerStateConfig.from_topic_config(config))


class Partition:
    def __init__(self, topic: str, index: int, log: PartitionLog, producer_config: ProducerStateConfig,
                 *, now_ms: int, lease: Lease | None = None) -> None:
        """Over an open log; producer state is loaded from its directory's snapshots and the log.
        `lease`: the ownership token this partition's writes are checked against (a cluster);
        None: the process owns the directory outright (a single node's exclusive lock)."""
        self.topic = topic
        self.index = index
        self.lease = lease
        self.log = log
        self.directory = log.directory
        self.snapshots = ProducerStateStore(log.directory)
        self.counters = ProducerStateCounters()
        # The pid hash's key: random per partition, so no client can choose colliding ids.
        self.producer_state = ProducerStateManager(producer_config, hash_key=secrets.randbits(64))
        self._format_magic = message_format_magic(log.config.message_format_version)
        self._codec = _topic_codec(log.config.compression_type)
        self._in_append = False
        self._log_generation = log.sync_generation
        self._roll_pending = False
        self._last_snapshot_offset = -1
        self._next_expiration_check = -1
        self._restored_since_snapshot = False  # the next snapshot is due even if the log did not move
        # open transactions and the LSO; each segment's aborted-transaction index is on its Segment
        self.txns = PartitionTxns()
        # KIP-890 checks in flight (Kafka's VerificationGuard): a marker for the producer voids them
        self.verification_guards = VerificationGuards()
        self.cleaner_checkpoint = -1  # the cleaner's first dirty offset once read (storage.cleaner)
        self._map_end = self._load_producer_state(now_ms)
        log.on_roll(self._on_roll)
        log.on_segments_deleted(self._on_segments_deleted)

    @classmethod
    def open(cls, topic: str, index: int, directory: Path, config: PartitionConfig, now_ms: int,
             *, leader_epoch: int = 0, lease: Lease | None = None) -> Partition:
        """Open (or create) the partition's directory: log recovery, then producer state (under
        the lease, whose token the caller raised before)."""
        with lease.writing() if lease is not None else nullcontext():
            log = PartitionLog.open(directory, config.log, now_ms)
            log.leader_epoch = leader_epoch
            return cls(topic, index, log, config.producer_state, now_ms=now_ms, lease=lease)

    # ------------------------------------------------------------------ ownership
    def writing(self) -> AbstractContextManager[None]:
        """Around every write to the partition's files: the lease's lock, after its check
        (`storage.fence`: Fenced once a newer owner raised the token, Busy while another process
        holds its lock). Re-entrant."""
        return self.lease.writing() if self.lease is not None else nullcontext()

    @property
    def fenced(self) -> bool:
        """A newer owner holds the partition: the broker drops it (`drop`) before answering
        anything from it. A lock-free read of the token (a memory load)."""
        return self.lease is not None and not self.lease.valid()

    def _not_leader(self, e: OSError) -> KafkaProtocolError:
        log.warning("%s-%d: %s", self.topic, self.index, e)
        return KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.index}: {e.strerror or e}")

    # ------------------------------------------------------------------ reads
    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def high_watermark(self) -> int:
        """The fsynced end (the end with write.caching): acks=all answers and consumers wait for it."""
        return self.log.high_watermark

    @property
    def last_stable_offset(self) -> int:
        """min(first offset of any unstable transaction, high watermark), never below the log
        start: what read_committed consumers may read. The high watermark when no transaction is
        open (librdkafka and kafkajs read read_committed by default)."""
        return self.txns.last_stable_offset(self.log.high_watermark, self.log.log_start_offset)

    def read(self, offset: int, max_bytes: int, min_one: bool = True, max_offset: int | None = None) -> bytes:
        """Whole batches from `offset`, none at or above `max_offset` (default: the high
        watermark; a read_committed fetch passes the LSO)."""
        return self.log.read(offset, max_bytes, self.log.high_watermark if max_offset is None else max_offset,
                             min_one)

    def read_region(self, offset: int, max_bytes: int, min_one: bool = True,
                    max_offset: int | None = None) -> FileRegion | None:
        """`read`'s batches as a region of their segment file, which a Fetch sends unread."""
        return self.log.read_region(offset, max_bytes,
                                    self.log.high_watermark if max_offset is None else max_offset, min_one)

    def aborted_transactions(self, fetch_offset: int, upper: int, max_scan: int | None = None) -> AbortedQuery:
        """The aborted transactions overlapping [fetch_offset, upper) (`core.txn.collect_aborted`),
        from the index of the segment holding `fetch_offset` and the later ones."""
        segments = self.log.segments
        k = self.log._segment_for(fetch_offset)
        indexes = [seg.aborted for seg in segments[k:] if seg.aborted is not None]
        return collect_aborted(indexes, fetch_offset, upper, max_scan)

    # ------------------------------------------------------------ durability
    @property
    def write_caching(self) -> bool:
        return self.log.config.write_caching

    @property
    def durable_end_offset(self) -> int:
        return self.log.durable_end_offset

    @property
    def sync_generation(self) -> int:
        return self.log.sync_generation

    @property
    def offline(self) -> str | None:
        return self.log.offline

    @property
    def fsyncs(self) -> int:
        """fsyncs of the log's active segment so far (group commits, the flush policy, rolls)."""
        return self.log.fsyncs

    def begin_sync(self, now_ms: int) -> SyncToken | None:
        """Group commit: an fsync of what was appended so far, for `run_sync` on a thread."""
        return self.log.begin_sync(now_ms)

    def run_sync(self, token: SyncToken) -> None:
        """Any thread: touches only the token's own descriptor."""
        self.log.run_sync(token)

    def end_sync(self, token: SyncToken, error: BaseException | None, now_ms: int) -> None:
        """Back on the loop: records become durable, or a failure cut them (state follows). A
        failure cuts the file, a write: a deposed owner cuts nothing and goes offline instead
        (what its fsync covered is the new owner's log now)."""
        if error is None:
            self.log.end_sync(token, error)
            return
        try:
            with self.writing():
                self.log.end_sync(token, error)
                self._follow_cuts(now_ms)
        except (Fenced, Busy) as e:
            self.log._take_offline(f"fsync failed ({error}) after the partition was fenced: {e}")

    def flush_due(self, now_ms: int) -> bool:
        return self.log.flush_due(now_ms)

    # ---------------------------------------------------- producer-state facts
    @property
    def producer_state_batches_to_retain(self) -> int:
        """ProduceResponse v14 tag 1 (KIP-1269)."""
        return self.producer_state.config.batches_to_retain

    @property
    def max_in_flight_sequence_number(self) -> int | None:
        """ProduceResponse v14 tag 10000: sent only for range-mode topics (its presence = range)."""
        cfg = self.producer_state.config
        return cfg.max_in_flight_sequence_number if cfg.dedup_mode == ps.RANGE else None

    @property
    def dedup_mode(self) -> str:
        return self.producer_state.mode

    @property
    def message_format_magic(self) -> int:
        return self._format_magic

    @property
    def producers_tracked(self) -> int:
        return len(self.producer_state)

    @property
    def producer_state_bytes(self) -> int:
        return self.producer_state.memory_bytes()

    def producer_state_stats(self) -> dict[str, int]:
        """The counters (monotonic) and gauges of this partition's producer state, as data: the
        broker's metrics module names them."""
        state = self.producer_state
        return {**self.counters.as_dict(), "producers": len(state), "bytes": state.memory_bytes(),
                "expired_remembered": len(state.expired), "producers_evicted": state.evictions,
                "remembered_forgotten": state.expired.forgotten}

    def _extra(self, **more: Any) -> dict[str, Any]:
        extra = {"producer_state_batches_to_retain": self.producer_state_batches_to_retain,
                 "max_in_flight_sequence_number": self.max_in_flight_sequence_number}
        extra.update(more)
        return extra

    # ---------------------------------------------------------------- config
    def update_config(self, config: PartitionConfig) -> None:
        """Runtime topic-config change: the log takes its part, the window applies to the next batch."""
        self.log.config = config.log
        stride = self.producer_state.stride
        self.producer_state.reconfigure(config.producer_state)
        if self.producer_state.stride != stride and not self._in_append:
            # The rings were re-laid: snapshot them, or a crash would rebuild the old layout.
            self.take_snapshot(sync=False, force=True)
        self._format_magic = message_format_magic(config.log.message_format_version)
        self._codec = _topic_codec(config.log.compression_type)

    # ----------------------------------------------------------------- writes
    def append_from_client(self, records: Buf, now_ms: int, *, verify: bool = False,
                           guard: Guard | None = None) -> AppendResult:
        """Validate, deduplicate, append. `verify` (KIP-890, Kafka's
        `batchMissingRequiredVerification`): a transactional batch that would open a transaction
        here (its producer has none open at that epoch) needs `guard`, the verification guard
        its transaction's check took, still valid now: a marker for the producer since then
        (the transaction ended while another partition of the request was being verified, say)
        refuses it with INVALID_TXN_STATE (`extra["unverified"]`) instead of opening a transaction
        its coordinator never registered."""
        try:
            with self.writing():
                return self._append_from_client(records, now_ms, verify, guard)
        except (Fenced, Busy) as e:
            err = self._not_leader(e)
            return AppendResult(int(err.code), -1, -1, self._safe_log_start(), err.message, self._extra())

    def _append_from_client(self, records: Buf, now_ms: int, verify: bool, guard: Guard | None) -> AppendResult:
        if self.log.offline:
            return AppendResult(int(ErrorCode.KAFKA_STORAGE_ERROR), -1, -1, self._safe_log_start(),
                                f"partition offline: {self.log.offline}", self._extra())
        self._follow_cuts(now_ms)
        try:
            buf = rec.writable(records)
            if len(buf) == 0:
                raise KafkaProtocolError(ErrorCode.INVALID_RECORD, "empty record set")
            check = None
            if rec.magic_of(buf) < 2 and self._format_magic >= 2:
                # A v0/v1 message set (Produce v0-v2) stored as the current format stores it,
                # as Kafka's LogValidator up-converts; it is then a plain batch like any other.
                buf = rec.upconvert_legacy_message_set(buf, self._codec)
            if rec.magic_of(buf) >= 2:
                headers = rec.validate_record_set(buf)
                if any(h.has_producer_id for h in headers):
                    check = self._prepare(headers)
                    if check.producer_id in self.producer_state.expired:
                        check = self._restore_expired(headers, check, now_ms)
                    if check.kind != ps.APPEND:
                        return self._answer_without_append(check)
                    transactional = headers[0].is_transactional
                    if (verify and transactional and not self.has_open_transaction(check.producer_id,
                                                                                   headers[0].producer_epoch)
                            and (guard is None or not self.verification_guards.valid(check.producer_id, guard))):
                        return AppendResult(
                            int(ErrorCode.INVALID_TXN_STATE), -1, -1, self._safe_log_start(),
                            f"the batch of producer {check.producer_id} would open a transaction in {self.topic}-"
                            f"{self.index} that its coordinator did not verify (it ended meanwhile)",
                            self._extra(unverified=True))
                    if self.txns.check_data_batch(check.producer_id, transactional):
                        raise KafkaProtocolError(
                            ErrorCode.INVALID_TXN_STATE,
                            f"producer {check.producer_id} has a transaction open in {self.topic}-"
                            f"{self.index}: a batch outside it must wait for its marker")
                if self.log.config.compact:
                    _refuse_keyless(buf, headers, f"{self.topic}-{self.index}")
                if self._codec is not None and any(h.compression != self._codec for h in headers):
                    buf = rec.recompress(buf, headers, self._codec)
            else:
                rec.validate_legacy_message_set(buf)
            self._in_append = True
            try:
                info = self.log.append(buf, now_ms)
                if check is not None:
                    self.producer_state.commit(check, info.first_offset, info.log_append_time, now_ms)
                    self.txns.on_data_batch(check.producer_id, info.first_offset, transactional)
                self._map_end = self.log.log_end_offset
            finally:
                self._in_append = False
            if self._roll_pending:
                self._roll_pending = False
                self.take_snapshot(sync=False)
        except KafkaProtocolError as exc:
            if exc.code == ErrorCode.KAFKA_STORAGE_ERROR:
                self._follow_cuts(now_ms)
            return AppendResult(int(exc.code), -1, -1, self._safe_log_start(), exc.message or exc.code.name,
                                self._extra(), record_errors=getattr(exc, "record_errors", []))
        except (Fenced, Busy):
            raise
        except OSError as exc:
            # Nothing was committed to producer state, so a retry of this batch is judged afresh.
            log.error("append to %s-%d failed: %s", self.topic, self.index, exc)
            return AppendResult(int(ErrorCode.KAFKA_STORAGE_ERROR), -1, -1, self._safe_log_start(),
                                f"storage error: {exc.strerror or exc}", self._extra())
        return AppendResult(0, info.first_offset, info.log_append_time, self.log.log_start_offset, None,
                            self._extra(), info.last_offset)

    # ------------------------------------------------------------ transactions
    def has_open_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """A transaction of this producer is open here at this epoch: its next transactional
        batch needs no KIP-890 verification."""
        return self.txns.has_open(producer_id) and self.producer_state.epoch_of(producer_id) == producer_epoch

    def append_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                      now_ms: int, transaction_version: int = 0) -> int:
        """Append a COMMIT/ABORT control batch for the producer's transaction; returns its offset.
        Raises KafkaProtocolError: INVALID_PRODUCER_EPOCH (marker epoch below the producer's),
        TRANSACTION_COORDINATOR_FENCED (coordinator epoch below the last seen),
        UNSUPPORTED_FOR_MESSAGE_FORMAT, KAFKA_STORAGE_ERROR. Not durable on return: the caller
        waits for the fsync as an acks=all Produce does (`storage.marker_append.write_marker`).
        A marker for a producer with no transaction open here closes nothing and is harmless (a
        coordinator resending after a crash). `transaction_version` (WriteTxnMarkers v2, KIP-1228):
        a Transactions V2 marker needs an epoch above the producer's while its transaction is open
        here (`core.producer_epoch.marker_error`)."""
        try:
            with self.writing():
                return self._append_marker(producer_id, producer_epoch, coordinator_epoch, commit, now_ms,
                                           transaction_version)
        except (Fenced, Busy) as e:
            raise self._not_leader(e) from None

    def _append_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                       now_ms: int, transaction_version: int) -> int:
        if self.log.offline:
            raise KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR, f"partition offline: {self.log.offline}")
        self._follow_cuts(now_ms)
        if self._format_magic < 2:
            raise KafkaProtocolError(ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                                     f"topic {self.topic} uses message format v{self._format_magic}: "
                                     "transaction markers need v2")
        state = self.producer_state
        if producer_id in state.expired and producer_id not in state:
            self._restore_from_log(producer_id, now_ms)
        code, message = state.check_marker(producer_id, producer_epoch, coordinator_epoch, transaction_version,
                                           self.txns.has_open(producer_id))
        if code:
            raise KafkaProtocolError(ErrorCode(code), message)
        batch = rec.encode_marker_batch(producer_id, producer_epoch, coordinator_epoch, commit, now_ms)
        self._in_append = True
        try:
            try:
                info = self.log.append(batch, now_ms)
            except (Fenced, Busy):
                raise
            except OSError as exc:
                raise KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR, f"storage error: {exc}") from None
            self._apply_marker(producer_id, producer_epoch, coordinator_epoch, commit, info.first_offset, now_ms)
            self._map_end = self.log.log_end_offset
        finally:
            self._in_append = False
        self.verification_guards.clear(producer_id, producer_epoch, transaction_version >= TV_2)
        if self._roll_pending:
            self._roll_pending = False
            self.take_snapshot(sync=False)
        return info.first_offset

    def _apply_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                      offset: int, now_ms: int) -> None:
        """A marker at `offset` is in the log (appended, or met by recovery's replay)."""
        self.producer_state.record_marker(producer_id, producer_epoch, coordinator_epoch, now_ms)
        completed = self.txns.prepare_marker(producer_id, offset, not commit)
        if completed is None:
            return
        if completed.is_aborted:
            txn_index.append(self.log.segment_holding(offset), completed)
        self.txns.complete(completed)

    def _prepare(self, headers: list[rec.BatchHeader]) -> ps.Check:
        if self._format_magic < 2:
            self.counters.unsupported_format += 1
            raise KafkaProtocolError(
                ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                f"topic {self.topic} uses message format v{self._format_magic}: idempotent and "
                "transactional produce need v2 (use enable.idempotence=requested or off)")
        if len(headers) != 1:
            raise KafkaProtocolError(ErrorCode.INVALID_RECORD,
                                     "an idempotent record set must hold exactly one batch per partition")
        h = headers[0]
        if h.is_control:
            raise KafkaProtocolError(ErrorCode.INVALID_RECORD, "clients may not produce control batches")
        if h.base_sequence < 0 or h.producer_epoch < 0:
            raise KafkaProtocolError(ErrorCode.INVALID_RECORD,
                                     f"batch with producer id {h.producer_id} has sequence {h.base_sequence} "
                                     f"and epoch {h.producer_epoch}")
        return self.producer_state.check(h.producer_id, h.producer_epoch, h.base_sequence, last_sequence_of(h))

    def _answer_without_append(self, check: ps.Check) -> AppendResult:
        if check.kind == ps.LOOKUP:
            check = self._lookup_older_duplicate(check)
        if check.kind == ps.DUPLICATE:
            assert check.duplicate_kind is not None  # a DUPLICATE verdict always names its kind
            setattr(self.counters, "duplicates_" + check.duplicate_kind,
                    getattr(self.counters, "duplicates_" + check.duplicate_kind) + 1)
            last = check.base_offset + distance_below(check.last_seq, check.first_seq)
            return AppendResult(0, check.base_offset, check.timestamp, self.log.log_start_offset, None,
                                self._extra(duplicate=check.duplicate_kind), last)
        counter = _ERROR_COUNTER.get(check.error)
        if counter:
            setattr(self.counters, counter, getattr(self.counters, counter) + 1)
        extra = self._extra(duplicate=ps.DUP_SEQUENCE) if check.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER \
            else self._extra()
        log_start = self.log.log_start_offset
        if check.error == ErrorCode.UNKNOWN_PRODUCER_ID:
            # The producer may be one forgotten for room while its batches are in the log: the
            # producer-state start lies above everything such a producer wrote, so its client
            # resets as after retention instead of reporting data loss.
            log_start = max(log_start, self.producer_state.state_start)
        return AppendResult(int(check.error), -1, -1, log_start, check.message, extra)

    def _lookup_older_duplicate(self, check: ps.Check) -> ps.Check:
        """KAFKA-5494's tail scan: find the exact original batch below the retained ones.

        Only an exact (producer, epoch, first, last) match counts, and the scan covers fewer than
        2**30 offsets, so a sequence reused after wraparound can never match: the answer is the
        right offset or the mode's error.
        """
        reach = self.producer_state.config.duplicate_lookup_offsets
        if reach <= 0:
            return check
        start = max(self.log.log_start_offset, check.base_offset - reach)
        if start >= check.base_offset:
            return check
        for h in self._headers_between(start, check.base_offset):  # reads only that range
            if h.base_offset >= check.base_offset:
                break
            if (h.producer_id == check.producer_id and h.producer_epoch == check.epoch
                    and h.base_sequence == check.first_seq and last_sequence_of(h) == check.last_seq
                    and h.base_offset >= start):
                return check._replace(kind=ps.DUPLICATE, base_offset=h.base_offset, timestamp=_append_time(h),
                                      duplicate_kind=ps.DUP_TAIL, error=0, message=None)
        return check

    def _restore_expired(self, headers: list[rec.BatchHeader], check: ps.Check, now_ms: int) -> ps.Check:
        """A batch from a producer whose state left the table (expiry, or eviction at the
        producer cap) while its batches are still in the log: put them back into the state, as
        recovery would, then judge the batch. Then an idle producer continues instead of meeting
        UNKNOWN_PRODUCER_ID with a log start offset below its last acknowledged offset (which its
        client must take for data loss), and a retry that arrives later is recognised as a
        duplicate instead of being appended again. Producer ids never seen are not remembered
        and cost no read at all."""
        if check.producer_id in self.producer_state:
            return check
        # No snapshot follows (it would cost the whole state per request): after a crash the
        # producer is remembered again, or, if it appended since, restored again by the replay.
        return self._prepare(headers) if self._restore_from_log(check.producer_id, now_ms) else check

    def _restore_from_log(self, pid: int, now_ms: int) -> bool:
        """Put a remembered producer's batches back into the state: the header of each batch it
        retained, read through the offset index (PartitionLog.batch_header_at), so the work is
        bounded by its window, not by what other producers wrote in between. Batches more than
        producer.state.expired.lookup.offsets below its newest, or gone below the log start,
        are left out."""
        state = self.producer_state
        remembered = state.expired.pop(pid)  # one restore per expiry or eviction
        if remembered is None:
            return False
        newest = remembered.offsets[-1]
        reach = state.config.expired_lookup_offsets
        found = []
        for offset in remembered.offsets:
            if offset < newest - reach:
                continue
            h = self.log.batch_header_at(offset)
            if h is not None and h.producer_id == pid and not h.is_control:
                found.append(h)
        if not found or found[-1].base_offset != newest:
            log.warning("%s-%d: remembered producer %d's newest batch is not at offset %d; not restored",
                        self.topic, self.index, pid, newest)
            return False
        for h in found:
            state.record(h.producer_id, h.producer_epoch, h.base_sequence, last_sequence_of(h),
                         h.base_offset, _append_time(h), now_ms)
        self.counters.restored += 1
        self._restored_since_snapshot = True
        log.info("%s-%d: producer %d restored from the log (%d batches from offset %d)",
                 self.topic, self.index, pid, len(found), found[0].base_offset)
        return True

    def _headers_between(self, start: int, end: int) -> Iterator[rec.BatchHeader]:
        try:
            yield from self.log.batch_headers_between(start, end)
        except KafkaProtocolError:  # the range left the log meanwhile (retention)
            return

    def _safe_log_start(self) -> int:
        try:
            return self.log.log_start_offset
        except Exception:  # noqa: BLE001 - the answer must still go out if the log is unusable
            return -1

    # ---------------------------------------------------------- compaction
    def cleaner_last_batches(self) -> dict[int, LastBatch]:
        """What the cleaner must keep of each producer tracked here (Kafka's
        lastRecordsOfActiveProducers): the base offset of its latest batch, or, when a marker
        with a new epoch is its latest entry, that epoch."""
        return {e.producer_id: LastBatch(e.batches[-1][2] if e.batches else -1, e.epoch)
                for e in self.producer_state.entries()}

    def segment_swapped(self, old: Segment, new: Segment) -> None:
        """The cleaner replaced `old` by `new`: the new file's aborted-transaction index."""
        txn_index.load(new)

    # ---------------------------------------------------------- periodic work
    def remove_expired_producers(self, now_ms: int) -> int:
        n = self.producer_state.remove_expired(now_ms, self.txns.has_open)
        self.counters.expirations += n
        if n and not self._in_append:
            # Otherwise a crash would replay the expired producers' batches from the log and
            # bring them back as if just seen.
            self.take_snapshot(sync=False, force=True)
        return n

    def tick(self, now_ms: int, check_interval_ms: int = DEFAULT_EXPIRATION_CHECK_INTERVAL_MS) -> None:
        """Kafka's PeriodicProducerExpirationCheck; the log manager calls this on its tick."""
        if now_ms >= self._next_expiration_check:
            self._next_expiration_check = now_ms + check_interval_ms
            self.remove_expired_producers(now_ms)

    # ------------------------------------------------------------- snapshots
    def _on_roll(self, new_segment_base_offset: int) -> None:
        if self._in_append:
            # The batch being appended is not committed yet: snapshot once it is.
            self._roll_pending = True
        else:
            self.take_snapshot(sync=False)

    def _on_segments_deleted(self, new_log_start_offset: int) -> None:
        self.producer_state.forget_expired_before(new_log_start_offset)
        self.txns.on_log_start_offset(new_log_start_offset)
        # The replay source below the new start is gone: the state must be in a snapshot.
        if new_log_start_offset > self._last_snapshot_offset and not self._in_append:
            self.take_snapshot(sync=True)

    def delete_records_before(self, offset: int) -> None:
        """DeleteRecords: snapshot first, so no crash can lose state whose batches are deleted."""
        try:
            with self.writing():
                self.take_snapshot(sync=True)
                self.log.delete_records_before(offset)
        except (Fenced, Busy) as e:
            raise self._not_leader(e) from None

    def enforce_retention(self, now_ms: int) -> int:
        """Retention (segments deleted by time or size), under the lease."""
        with self.writing():
            return self.log.enforce_retention(now_ms)

    def take_snapshot(self, sync: bool = True, force: bool = False) -> Path | None:
        """Write the state covering offsets below `_map_end`; skipped when the log did not move
        since the last one unless `force` (the state changed without the log: expiry) or an
        expired producer was restored since."""
        if self._map_end <= self._last_snapshot_offset and not force and not self._restored_since_snapshot:
            return None
        with self.writing():
            return self._write_snapshot(sync)

    def _write_snapshot(self, sync: bool) -> Path:
        # the snapshot says recovery need not look below _map_end: the aborted-transaction
        # entries below it must be on disk first
        txn_index.sync_dirty(self.log.segments)
        opened = self.txns.open_transactions()
        cols = self.producer_state.columns()._replace(
            txn_pid=array("q", [pid for pid, _first in opened]), txn_first=array("q", [f for _pid, f in opened]))
        path = self.snapshots.write(self._map_end, cols, sync=sync)
        self._last_snapshot_offset = self._map_end
        self._restored_since_snapshot = False
        self.counters.snapshots_written += 1
        return path

    def truncate_to(self, offset: int, now_ms: int | None = None) -> None:
        """Cut the log to `offset` and rebuild producer state for what is left (Kafka's
        truncateTo -> rebuildProducerState): snapshots beyond it go, then snapshot + replay."""
        with self.writing():
            self.log.truncate_to(offset)
            self._rebuild_producer_state(_now() if now_ms is None else now_ms)

    def _rebuild_producer_state(self, now_ms: int) -> None:
        self.snapshots.delete_beyond(self.log.log_end_offset)
        self.producer_state.clear()
        self.txns = PartitionTxns()
        self._last_snapshot_offset = -1
        self._map_end = self._load_producer_state(now_ms)

    def _follow_cuts(self, now_ms: int) -> None:
        """The log dropped unsynced records since we last looked (a failed fsync): rebuild."""
        generation = self.log.sync_generation
        if generation != self._log_generation:
            self._log_generation = generation
            self._rebuild_producer_state(now_ms)
            log.warning("%s-%d: producer state rebuilt after a failed fsync cut the log back to offset %d",
                        self.topic, self.index, self.log.log_end_offset)

    def maybe_flush(self, now_ms: int) -> None:
        """The flush policy, run periodically; a failed fsync leaves state that follows the log."""
        with self.writing():   # a failed fsync cuts the file
            try:
                self.log.maybe_flush(now_ms)
            finally:
                self._follow_cuts(now_ms)

    def close(self) -> None:
        """Clean shutdown: a final snapshot so the next start replays nothing (an offline
        partition writes nothing: the next start recovers it from the log). A fenced partition is
        dropped instead: a newer owner has the files."""
        try:
            with self.writing():
                try:
                    if not self.log.offline:
                        self.take_snapshot(sync=True)
                except OSError as e:
                    # a full disk at shutdown: the stop goes on, the next start replays the log
                    log.error("%s-%d: no producer-state snapshot at shutdown (%s): the next start "
                              "rebuilds it from the log", self.topic, self.index, e.strerror or e)
                finally:
                    self.log.close()
        except (Fenced, Busy) as e:
            log.info("%s-%d: not closed cleanly (%s); dropped", self.topic, self.index, e)
            self.drop()
        finally:
            if self.lease is not None:
                self.lease.close()

    def drop(self) -> None:
        """Another broker owns the partition now: close its files and write nothing (no
        snapshot, no clean-shutdown marker; the new owner recovered from the log). It goes
        offline, so nothing starts an fsync of it any more, and appends still waiting for one are
        answered as not durable here (their producers retry at the new leader, which has them)."""
        if not self.log.offline:
            self.log.offline = "another broker leads the partition now"   # (not a storage fault: no alarm)
        for seg in self.log.segments:
            seg.close()
        if self.lease is not None:
            self.lease.close()

    def _load_producer_state(self, now_ms: int) -> int:
        """Newest readable snapshot, then the log above it. Returns the offset the state covers."""
        if self.log.offline:
            # recovery failed (an fsync, say): nothing of the log may be read, and the partition
            # answers KAFKA_STORAGE_ERROR until a restart recovers it; the broker serves the others
            return self.log.log_start_offset
        log_end = self.log.log_end_offset
        log_start = self.log.log_start_offset
        start = log_start
        self.producer_state.forget_expired_before(log_start)
        loaded = self.snapshots.load(log_end, lambda cols: self._load_snapshot(cols, now_ms))
        self.counters.snapshots_set_aside += loaded.set_aside
        if loaded.offset is not None:
            start = max(loaded.offset, log_start)
            self._last_snapshot_offset = loaded.offset
        # Remembered batches the log no longer holds (deleted, or cut off by a truncation).
        self.producer_state.expired.forget_outside(log_start, log_end)
        # Aborted-transaction entries at or above the replay start are rebuilt by the replay.
        for seg in self.log.segments:
            if seg.aborted is None:
                txn_index.load(seg)
            txn_index.truncate_from(seg, start)
        replayed = self._replay(start, log_end, now_ms)
        if replayed:
            self._map_end = log_end
            self.take_snapshot(sync=False)
        return log_end

    def _load_snapshot(self, cols: ps.ProducerSnapshotColumns, now_ms: int) -> None:
        """A snapshot's state, all or nothing: one that does not apply (ValueError) leaves none."""
        try:
            self.txns.load(zip(cols.txn_pid or (), cols.txn_first or ()))
            self.producer_state.load_columns(cols, now_ms, self.txns.has_open)
        except ValueError:
            self.producer_state.clear()
            self.txns = PartitionTxns()
            raise

    def _replay(self, start: int, end: int, now_ms: int) -> int:
        """Rebuild from the log without validation (it was validated when appended)."""
        if start >= end:
            return 0
        n = 0
        state = self.producer_state
        for h in self._iter_headers(start):
            if h.base_offset >= end:
                break
            if h.producer_id < 0 or h.base_offset < start:
                continue
            if h.is_control:
                self._replay_marker(h, now_ms)
                n += 1
                continue
            if h.producer_id in state.expired and h.producer_id not in state:
                # Restored after the snapshot was taken and appended since: restore it again
                # first, so that its window holds what it held before the crash.
                self._restore_from_log(h.producer_id, now_ms)
            ts = _append_time(h)
            # Replayed producers count as seen now: their true idle time is unknown, and expiring
            # one too early would turn its next batch into a spurious UNKNOWN_PRODUCER_ID.
            state.record(h.producer_id, h.producer_epoch, h.base_sequence, last_sequence_of(h), h.base_offset,
                         ts, now_ms)
            self.txns.on_data_batch(h.producer_id, h.base_offset, h.is_transactional)
            n += 1
        return n

    def _replay_marker(self, h: rec.BatchHeader, now_ms: int) -> None:
        """A control batch met by recovery: its one record's key says COMMIT or ABORT (one read
        of that batch; markers are few). One the cleaner emptied (kept only because it is its
        producer's latest entry) still carries the producer's epoch."""
        if h.records_count == 0:
            self.producer_state.record_marker(h.producer_id, h.producer_epoch, -1, now_ms)
            return
        data = self.log.read(h.base_offset, h.size, h.base_offset + 1)
        try:
            marker = rec.marker_of_batch(data)
        except KafkaProtocolError as exc:  # not a transaction marker (another control type)
            log.warning("%s-%d: control batch at offset %d skipped: %s", self.topic, self.index,
                        h.base_offset, exc.message)
            return
        self._apply_marker(h.producer_id, h.producer_epoch, marker.coordinator_epoch, marker.commit,
                           h.base_offset, now_ms)

    def _iter_headers(self, start: int) -> Iterator[rec.BatchHeader]:
        """v2 batch headers from the log at `start` (v0/v1 messages carry no producer ids)."""
        try:
            yield from self.log.iter_batches_from(start)
        except KafkaProtocolError:  # the start left the log meanwhile (retention)
            return


class RecordErrors(KafkaProtocolError):
    """INVALID_RECORD naming the records at fault (ProduceResponse v8+ RecordErrors, KIP-467):
    librdkafka fails those with INVALID_RECORD and the rest of their batch with
    _INVALID_DIFFERENT_RECORD."""

    def __init__(self, message: str, record_errors: list[tuple[int, str | None]]) -> None:
        super().__init__(ErrorCode.INVALID_RECORD, message)
        self.record_errors = record_errors


def _refuse_keyless(buf: Buf, headers: list[rec.BatchHeader], where: str) -> None:
    """A compacted topic takes only records with a key (Kafka's LogValidator: INVALID_RECORD)."""
    view = memoryview(buf)
    pos = 0
    errors: list[tuple[int, str | None]] = []
    index = 0
    for h in headers:
        data = view[pos + rec.BATCH_OVERHEAD:pos + h.size]
        if h.compression:
            data = memoryview(compression.decompress(h.compression, data))
        try:
            keyless = keyless_records(data, h.records_count)
        except (ValueError, IndexError):
            raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "records do not decode") from None
        message = f"Compacted topic cannot accept message without key in topic partition {where}."
        errors.extend((index + i, message) for i in keyless)
        index += h.records_count
        pos += h.size
    if errors:
        raise RecordErrors(errors[0][1] or "", errors)


def _v2_headers(buf: Buf) -> Iterator[rec.BatchHeader]:
    """Headers of the v2 batches in a chunk of log that may also hold v0/v1 messages (a topic
    whose format changed)."""
    return (h for _pos, h in rec.iter_batches(buf) if h.magic >= 2)


def _append_time(h: rec.BatchHeader) -> int:
    """What producer state keeps as a batch's timestamp: its log append time, or -1 (CreateTime)."""
    return h.max_timestamp if h.timestamp_type == 1 else -1


def _now() -> int:
    return int(time.time() * 1000)
