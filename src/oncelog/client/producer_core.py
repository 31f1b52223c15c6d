"""The producer's decisions, without I/O (h11 style): feed it records, metadata, responses and the
clock; ask it what to send. The asyncio transport (`client/aio`) only moves bytes.

Idempotence rules (KAFKA-5494, KIP-360, KIP-1269, KIP-758, "spurious OutOfOrderSequence"):
- a sequence is assigned when a batch is drained, never at append; a retried batch keeps it and is
  re-queued in sequence order;
- while a partition recovers from an error, only its head-of-line batch (the one right after the
  last acknowledged sequence) is in flight, alone;
- a batch is only ever written under one (producer id, epoch, sequence). It is renumbered (under a
  bumped epoch) only when the broker cannot hold it: it is after a gap that is certain, and every
  batch before the gap is resolved (acknowledged or given up) under its old sequence first;
- a batch given up while its outcome is unknown (delivery timeout, retries used up, close) leaves
  its partition *unresolved* (the Java client's unresolved sequences): no new batch is drained,
  the later batches are retried under their old sequences, and an acknowledgement of one of them
  resolves it (the given-up batch was written); OUT_OF_ORDER_SEQUENCE_NUMBER on the batch right
  after it, or nothing left to ask with, is a gap: bump the epoch and renumber what follows;
- OUT_OF_ORDER_SEQUENCE_NUMBER on the batch right after the last acknowledged one is a real gap:
  bump the epoch (KIP-360) and renumber from it; on a later batch it is a knock-on effect of an
  earlier failure: retry. The idempotent producer bumps its epoch itself, as Kafka's does (a
  higher epoch at sequence 0 starts afresh; InitProducerId without a transactional id always
  answers a new id), and asks for a new id only when the epoch is exhausted;
- UNKNOWN_PRODUCER_ID: log start offset above the last acknowledged offset means retention removed
  the producer's state: restart the partition's sequence at 0 and retry; otherwise acknowledged data
  is gone: fatal DataLossError naming partition and offsets;
- DUPLICATE_SEQUENCE_NUMBER, and a batch given up after a later one was acknowledged: delivered,
  offset unknown (None);
- InitProducerId: an answer's error decides between retrying after `retry.backoff.ms`, asking again
  for a fresh id (a bump the broker refused), producing without idempotence (`requested`, the
  broker cannot give an id) and a fatal error;
- two in-flight checks before each send: per partition the window the leader reported
  (ProducerStateBatchesToRetain; 5 until learned, and again after a leader change or a new
  connection), per connection `max.in.flight.requests.per.connection`; in range mode (the leader
  reported MaxInFlightSequenceNumber) the unacknowledged sequences of a partition stay under that
  threshold instead of a batch count, and after a leader change under both the last threshold and
  5 batches until the new leader answers.

What a failed record's error says (`KafkaClientError.possibly_written`): False = the records are
not in the log (never sent, or refused by the broker on every attempt); True = the producer gave
up without knowing (they may be in the log, at most once and in order, or not). A record reported
successful is in the log, at the reported offset unless that is None.

One concern in one module, over 600 lines on purpose: the idempotent producer's decisions, whose
rules above depend on each other.
"""
from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oncelog.client.accumulator import ProducerBatch, RecordAccumulator, TopicPartition, TxnProducerBatch
from oncelog.client.config import DEFAULT_WINDOW, Idempotence, ProducerConfig
from oncelog.client.errors import (
    AuthorizationError,
    BrokerResponseError,
    DataLossError,
    DeliveryTimeoutError,
    IdempotenceUnsupportedError,
    KafkaClientError,
    ProducerFatalError,
    ProducerFencedError,
)
from oncelog.core.log_limit import LogLimit, held_back
from oncelog.core.producer_epoch import can_bump_locally
from oncelog.core.sequence import decrement, distance_below, increment, seq_before
from oncelog.protocol.errors import RETRIABLE, ErrorCode
from oncelog.protocol.errors import error_code as error_name

if TYPE_CHECKING:
    from oncelog.client.txn_core import TransactionManager

log = logging.getLogger("oncelog.client.producer")
retry_log = logging.getLogger("oncelog.client.producer.retries")   # `oncelog produce` shows these

E = ErrorCode
_REFRESH_METADATA = {E.NOT_LEADER_OR_FOLLOWER, E.UNKNOWN_TOPIC_OR_PARTITION, E.LEADER_NOT_AVAILABLE,
                     E.FENCED_LEADER_EPOCH, E.UNKNOWN_LEADER_EPOCH, E.KAFKA_STORAGE_ERROR,
                     E.NOT_ENOUGH_REPLICAS}
_NEW_LEADER = {E.NOT_LEADER_OR_FOLLOWER, E.FENCED_LEADER_EPOCH}   # may carry CurrentLeader (KIP-951)
_FATAL = {E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING,
          E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED}
# Answers a broker gives before it appends anything: this attempt is not in the log. Any other
# error (NOT_LEADER_OR_FOLLOWER from a leader that lost its term while waiting for acks,
# REQUEST_TIMED_OUT, a storage error, no answer at all) leaves the attempt possibly written.
_NOT_APPENDED = {E.OUT_OF_ORDER_SEQUENCE_NUMBER, E.UNKNOWN_PRODUCER_ID, E.INVALID_PRODUCER_EPOCH,
                 E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING, E.CORRUPT_MESSAGE, E.INVALID_RECORD,
                 E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE, E.INVALID_TIMESTAMP,
                 E.UNSUPPORTED_FOR_MESSAGE_FORMAT, E.UNKNOWN_TOPIC_OR_PARTITION, E.UNKNOWN_TOPIC_ID,
                 E.TOPIC_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED,
                 E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, E.INVALID_REQUIRED_ACKS, E.INVALID_REQUEST,
                 E.UNSUPPORTED_VERSION, E.NOT_ENOUGH_REPLICAS, E.LEADER_NOT_AVAILABLE,
                 E.INVALID_TOPIC_EXCEPTION, E.INVALID_TXN_STATE, E.TRANSACTION_ABORTABLE}
# In a transaction these make the transaction abortable, not the producer fatal (Java's
# InvalidProducerEpochException on Produce; a lost producer-id mapping is cured by a bump).
_TXN_ABORTABLE = {E.INVALID_PRODUCER_EPOCH, E.INVALID_PRODUCER_ID_MAPPING}
# InitProducerId answers worth asking again after retry.backoff.ms
_RETRIABLE_PID = {E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR,
                  E.CONCURRENT_TRANSACTIONS, E.REQUEST_TIMED_OUT, E.NETWORK_EXCEPTION}
# answers to a bump (KIP-360, id and epoch sent) after which a fresh id is asked for at once
_BUMP_REFUSED = {E.INVALID_PRODUCER_ID_MAPPING, E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED,
                 E.UNSUPPORTED_VERSION, E.INVALID_REQUEST}
_AUTHORIZATION = {E.CLUSTER_AUTHORIZATION_FAILED, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
_UNHEARD = object()   # what the current leader reported, before it has answered


@dataclass
class PartitionState:
    leader: int = -1
    leader_epoch: int = -1
    window: int = DEFAULT_WINDOW          # KIP-1269: batches the leader retains for us
    max_inflight_sequences: int | None = None  # KIP-758 threshold, the last one a leader reported
    range_mode: bool = False              # the current leader reported that threshold
    reported_window: Any = _UNHEARD       # the fields as the current leader last sent them
    reported_threshold: Any = _UNHEARD
    idempotent: bool = True
    producer_id: int = -1                 # id/epoch the partition's sequences refer to
    producer_epoch: int = -1
    next_sequence: int = 0
    last_acked_sequence: int = -1
    last_acked_offset: int = -1
    in_flight: int = 0                    # batches on the wire
    unacked: list = field(default_factory=list)  # sequenced batches not yet resolved, in order
    unacked_records: int = 0              # sum of their record counts
    next_ordinal: int = 0                 # sequenced batches assigned in this epoch
    retrying: int = 0                     # unacked batches that must go head-of-line, alone
    rewrite_from: int | None = None       # batches from this sequence on are renumbered, once
                                          # those before it are resolved and nothing is on the wire
    unresolved: int | None = None         # the sequence after a batch given up with its outcome
                                          # unknown, until a later batch tells what became of it
    gap: bool = False                     # transactional: the renumbering waits for a new epoch
                                          # from the coordinator (start_epoch)
    max_in_flight_seen: int = 0           # highest in_flight reached (tests and benchmarks)

    @property
    def rewrite_pending(self) -> bool:
        return self.rewrite_from is not None

    def limit_reached(self, b: ProducerBatch) -> bool:
        if not self.idempotent:
            return False   # no dedup window to protect: only the per-connection limit applies
        if self.last_acked_sequence < 0 and self.in_flight:
            # Until the first batch of an epoch is acknowledged, one at a time: a broker without
            # state for us accepts any first sequence (Kafka does), so if sequence 0 failed
            # while sequence 1 was in flight, 1 would be written before 0.
            return True
        if b.has_sequence:
            return self.in_flight >= self.window and not self.range_mode
        if not self.unacked:
            return False
        # Count the span from the oldest unacknowledged batch, not just what is on the wire:
        # batches acknowledged after it still occupy the broker's retained window, and the
        # oldest one must still be recognisable as a duplicate when it is retried.
        if self.max_inflight_sequences is not None:
            span = distance_below(self.next_sequence, self.unacked[0].base_sequence)
            if span + b.count > self.max_inflight_sequences:
                return True
            if self.range_mode:
                return False
            # a new leader that has not answered yet may keep a range or only 5 batches: both
        return self.next_ordinal - self.unacked[0].ordinal >= self.window


@dataclass
class Completion:
    batch: ProducerBatch
    error: BaseException | None
    base_offset: int | None
    log_append_time: int = -1


@dataclass
class PartitionResult:
    """One partition's part of a ProduceResponse, as the core needs it."""
    error_code: int = 0
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    batches_to_retain: int | None = None       # ProduceResponse v14 tag 1; None = field absent
    max_inflight_sequences: int | None = None  # tag 10000: range mode threshold, if sent
    current_leader: tuple[int, int] | None = None  # KIP-951 CurrentLeader (id, epoch), if sent


def possibly_written(err: BaseException) -> BaseException:
    """`err` for records that may be in the log: a copy flagged `possibly_written` (the error
    objects are shared between batches, and its class's constructor may take other arguments)."""
    if getattr(err, "possibly_written", False):
        return err
    flagged = err.__class__.__new__(err.__class__)
    flagged.__dict__.update(err.__dict__)
    flagged.args = err.args
    flagged.possibly_written = True  # type: ignore[attr-defined]  # read with getattr
    flagged.__cause__ = err.__cause__
    return flagged


class ProducerCore:
    def __init__(self, config: ProducerConfig, *, idempotence_available: bool = True) -> None:
        self.config = config
        self.acc = RecordAccumulator(config.batch_size, config.linger_ms, config.buffer_memory,
                                     config.compression)
        if config.transactional_id is not None:
            self.acc.batch_class = TxnProducerBatch
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.node_in_flight: dict[int, int] = {}
        self.on_wire: set[ProducerBatch] = set()   # sent, answer not in yet (fail_all fails them)
        self.producer_id = -1
        self.producer_epoch = -1
        self.idempotent = config.idempotence is not Idempotence.OFF
        self.init_pid_in_progress = False
        self.producer_id_retry_at = 0        # ms: no InitProducerId before then (backoff)
        self.bump_requested = False
        self.fatal: BaseException | None = None
        self.metadata_refresh_needed = False
        self.completions: list[Completion] = []
        self.topic_idempotent: dict[str, bool] = {}
        self.topic_errors: dict[str, BaseException] = {}
        self._drain_start = 0
        # what recovery cost, for operators and `oncelog verify`: retries, epoch_bumps,
        # sequence_resets (UNKNOWN_PRODUCER_ID after retention), duplicates (acked as duplicates),
        # given_up (batches given up with their outcome unknown), resolved (of those, proven
        # written by a later acknowledgement)
        self.stats: Counter[str] = Counter()
        self._retry_logs: dict[str, LogLimit] = {}   # per error: how often a retry is logged
        # the transaction manager, for a transactional producer (txn_core): it owns
        # InitProducerId and epochs, says which partitions may be sent to, and hears of failures
        self.txn: TransactionManager | None = None
        if not idempotence_available:
            self.broker_lacks_idempotence()

    # ------------------------------------------------------------------ setup / metadata

    def broker_lacks_idempotence(self, why: str = "no InitProducerId / message format v2") -> None:
        """The cluster cannot do idempotence: requested -> plain producing, required -> fail."""
        if not self.idempotent:
            return
        if self.config.idempotence is Idempotence.REQUIRED:
            self.go_fatal(IdempotenceUnsupportedError(
                f"enable.idempotence=required but the broker does not support idempotent "
                f"producing ({why})"))
        else:
            log.warning("broker does not support idempotence (%s): producing without it "
                        "(enable.idempotence=requested)", why)
            self.idempotent = False
            for ps in self.partitions.values():
                self._drop_sequences(ps)

    def topic_message_format(self, topic: str, supports_v2: bool, version: str = "") -> None:
        """Learned from Metadata (our tag 10000), DescribeConfigs `message.format.version` or an
        UNSUPPORTED_FOR_MESSAGE_FORMAT answer."""
        if supports_v2 or not self.idempotent:
            self.topic_idempotent[topic] = True
            return
        what = f"topic {topic} uses message format {version or 'older than v2'}"
        if self.config.idempotence is Idempotence.REQUIRED:
            err = self.topic_errors.get(topic)
            if err is None:
                err = self.topic_errors[topic] = IdempotenceUnsupportedError(
                    f"enable.idempotence=required but {what}; idempotent producing needs v2")
            for tp, q in self.acc.queues.items():
                if tp.topic == topic:
                    ps = self._state(tp)
                    while q:
                        self._finish_unacked(q.popleft(), ps, err)
            return
        if self.topic_idempotent.get(topic) is not False:
            log.warning("%s: producing to it without idempotence (enable.idempotence=requested)", what)
        self.topic_idempotent[topic] = False
        for tp, ps in self.partitions.items():
            if tp.topic == topic:
                self._drop_sequences(ps)

    def _state(self, tp: TopicPartition) -> PartitionState:
        ps = self.partitions.get(tp)
        if ps is None:
            ps = self.partitions[tp] = PartitionState()
            ps.idempotent = self.idempotent and self.topic_idempotent.get(tp.topic, True)
        return ps

    def partition_state(self, tp: TopicPartition) -> PartitionState:
        return self._state(tp)

    def update_leader(self, tp: TopicPartition, node: int, leader_epoch: int = -1) -> bool:
        """Metadata (or a CurrentLeader) names a partition's leader. An older leader epoch than
        the one known never replaces it (a broker's metadata may lag). True if applied."""
        ps = self._state(tp)
        if leader_epoch >= 0 and leader_epoch < ps.leader_epoch:
            return False
        changed = ps.leader != node or (leader_epoch >= 0 and ps.leader_epoch >= 0
                                        and leader_epoch != ps.leader_epoch)
        if changed:
            if ps.leader != -1:
                log.info("leader of %s-%d changed %d/%d -> %d/%d: in-flight window back to %d",
                         tp.topic, tp.partition, ps.leader, ps.leader_epoch, node, leader_epoch,
                         DEFAULT_WINDOW)
            self._reset_window(ps)
        ps.leader = node
        if leader_epoch >= 0:
            ps.leader_epoch = leader_epoch
        return True

    def on_connected(self, node: int) -> None:
        """A connection to `node` was established (KIP-1269 "Initial State"): the broker behind
        it may be another version than the last one there, so its partitions start at 5 again."""
        for ps in self.partitions.values():
            if ps.leader == node:
                self._reset_window(ps)

    @staticmethod
    def _reset_window(ps: PartitionState) -> None:
        # KIP-1269: the leader may be an old broker with a hard-coded window of 5. A range-mode
        # threshold is kept (and 5 batches added to it) until the leader answers: dropping it
        # would let more sequences out than the broker recognises as duplicates (KIP-758).
        ps.window = DEFAULT_WINDOW
        ps.range_mode = False
        ps.reported_window = ps.reported_threshold = _UNHEARD

    def _learn(self, tp: TopicPartition, ps: PartitionState, r: PartitionResult) -> None:
        """The leader's window and range threshold, from its answer (only called on a change)."""
        if r.error_code and r.error_code in _REFRESH_METADATA:
            return   # not the leader's word: a refusal carries no producer-state fields
        window = ps.reported_window = r.batches_to_retain
        threshold = ps.reported_threshold = r.max_inflight_sequences
        if window is not None and window < 1:
            log.warning("%s-%d: leader %d reported ProducerStateBatchesToRetain=%d: ignored, "
                        "window stays %d", tp.topic, tp.partition, ps.leader, window, DEFAULT_WINDOW)
            window = None
        if threshold is not None and threshold < 1:
            log.warning("%s-%d: leader %d reported a range threshold of %d: ignored", tp.topic,
                        tp.partition, ps.leader, threshold)
            threshold = None
        # KIP-1269: the field is absent on old brokers (and older Produce versions) = 5
        ps.window = window or DEFAULT_WINDOW
        ps.max_inflight_sequences = threshold
        ps.range_mode = threshold is not None

    # ------------------------------------------------------------------ producer id

    def producer_id_request(self, now_ms: int | None = None) -> tuple[int, int] | None:
        """(producer id, epoch) to send in InitProducerId (-1/-1 for a fresh id), if one is due
        (`now_ms` None: whatever the backoff after a failed request says)."""
        if not self.idempotent or self.init_pid_in_progress or self.fatal or self.txn is not None:
            return None
        if now_ms is not None and now_ms < self.producer_id_retry_at:
            return None
        if self.producer_id < 0:
            self.init_pid_in_progress = True
            return (-1, -1)
        if self.bump_requested:
            if not can_bump_locally(self.producer_epoch):
                self.init_pid_in_progress = True
                return (-1, -1)  # the epoch is exhausted: a new id
            self.on_producer_id(self.producer_id, self.producer_epoch + 1)  # KIP-360, no request
        return None

    def on_producer_id(self, producer_id: int, producer_epoch: int, routine: bool = False) -> None:
        """A new id/epoch; `routine`: the transaction coordinator's (Transactions V2 moves to a
        new epoch at every EndTxn), not worth a warning."""
        if self.producer_id >= 0:
            log.log(logging.DEBUG if routine else logging.WARNING, "producer id/epoch %d/%d -> %d/%d",
                    self.producer_id, self.producer_epoch, producer_id, producer_epoch)
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.init_pid_in_progress = False
        self.bump_requested = False

    def producer_id_wait_ms(self, now_ms: int) -> int | None:
        """While the producer has no id and waits out a failed InitProducerId's backoff: the ms
        until it may ask again (at least 1); else None."""
        if (self.idempotent and self.producer_id < 0 and not self.init_pid_in_progress
                and self.txn is None):
            return max(1, self.producer_id_retry_at - now_ms)
        return None

    @staticmethod
    def init_producer_id_fields(producer_id: int, producer_epoch: int, version: int) -> tuple[int, int]:
        """The id and epoch to put in an InitProducerId request of `version`: a broker without
        KIP-360 (below v3) cannot bump an epoch, so it is asked for a fresh id instead."""
        if producer_id >= 0 and version < 3:
            return -1, -1
        return producer_id, producer_epoch

    def on_init_producer_id(self, asked_id: int, error_code: int, producer_id: int,
                            producer_epoch: int, now_ms: int, *, retried: bool = False) -> bool:
        """An InitProducerId answer to a request that sent `asked_id` (-1: a fresh id). True if
        the shell should ask again at once for a fresh id (the broker refused a bump; `retried`
        is set on the answer to that second request, which is then taken as it comes)."""
        if error_code and asked_id >= 0 and error_code in _BUMP_REFUSED and not retried:
            log.warning("InitProducerId bump refused (%s): taking a fresh producer id",
                        error_name(error_code).name)
            return True
        name = error_name(error_code).name
        if error_code == 0:
            self.on_producer_id(producer_id, producer_epoch)
        elif error_code in _RETRIABLE_PID:
            self.producer_id_retry_later(KafkaClientError(name), now_ms)
        elif (error_code in _AUTHORIZATION and asked_id < 0 and self.producer_id < 0
              and self.config.idempotence is Idempotence.REQUIRED):
            # a refusal, not a missing feature: say which ACL is missing (Java's
            # ClusterAuthorizationException), instead of "the broker does not support" it
            self.on_producer_id_failed(AuthorizationError(error_code, (
                f"not authorized to produce idempotently: InitProducerId answered {name} (the principal "
                "needs WRITE on the topic or IDEMPOTENT_WRITE on the cluster, KIP-679: `oncelog acl create "
                "--allow-principal User:NAME --operation write --topic TOPIC`)")), fatal=True)
        elif asked_id < 0 and self.producer_id < 0:
            self.on_producer_id_failed(KafkaClientError(name))
            if error_code in _AUTHORIZATION:   # requested: plain producing needs only WRITE on the topic
                log.warning("not authorized to produce idempotently (InitProducerId answered %s): producing "
                            "without idempotence (enable.idempotence=requested)", name)
                self.idempotent = False
                for ps in self.partitions.values():
                    self._drop_sequences(ps)
            else:
                self.broker_lacks_idempotence(f"InitProducerId failed with {name}")
        else:
            self.on_producer_id_failed(KafkaClientError(f"InitProducerId failed: {name}"), fatal=True)
        return False

    def on_init_producer_id_unsupported(self) -> None:
        """The broker has no InitProducerId (it lacks idempotence)."""
        self.on_producer_id_failed(KafkaClientError("no InitProducerId"))
        self.broker_lacks_idempotence("no InitProducerId in ApiVersions")

    def producer_id_retry_later(self, error: BaseException, now_ms: int) -> None:
        """InitProducerId got no usable answer (connection lost, timed out, a retriable error):
        ask again after retry.backoff.ms."""
        self.on_producer_id_failed(error)
        self.producer_id_retry_at = now_ms + self.config.retry_backoff_ms

    def on_producer_id_failed(self, error: BaseException, *, fatal: bool = False) -> None:
        self.init_pid_in_progress = False
        if fatal:
            self.go_fatal(error if isinstance(error, ProducerFatalError) else ProducerFatalError(str(error)))

    def _request_bump(self, tp: TopicPartition, reason: str, from_sequence: int,
                      level: int = logging.WARNING) -> None:
        """A gap in `tp` at `from_sequence`: the batches from there on are renumbered under an
        epoch this partition has not used yet."""
        ps = self._state(tp)
        if self.txn is not None:
            # only the coordinator gives a new epoch, after the transaction is aborted: the
            # batches from the gap on fail (abortable), and start_epoch renumbers what is left
            log.log(level, "%s-%d: %s: the transaction must be aborted (sequence gap at %d)",
                    tp.topic, tp.partition, reason, from_sequence)
            ps.gap = True
            self._rewrite_from(ps, from_sequence)
            self.txn.on_sequence_gap(tp, reason)
            return
        log.log(level, "%s-%d: %s: bumping the producer epoch and renumbering the partition from "
                "sequence %d", tp.topic, tp.partition, reason, from_sequence)
        if (ps.producer_id, ps.producer_epoch) == (self.producer_id, self.producer_epoch) \
                and not self.bump_requested:
            # (otherwise a bump another partition asked for already gives one)
            self.stats["epoch_bumps"] += 1
            self.bump_requested = True
        self._rewrite_from(ps, from_sequence)

    def _request_reset(self, tp: TopicPartition, reason: str, from_sequence: int) -> None:
        log.warning("%s-%d: %s: restarting the partition's sequence at 0", tp.topic, tp.partition,
                    reason)
        self.stats["sequence_resets"] += 1
        self._rewrite_from(self._state(tp), from_sequence)

    @staticmethod
    def _rewrite_from(ps: PartitionState, seq: int) -> None:
        if ps.rewrite_from is None or seq_before(seq, ps.rewrite_from):
            ps.rewrite_from = seq
        if ps.unresolved is not None and not seq_before(ps.unresolved, ps.rewrite_from):
            ps.unresolved = None   # what follows the given-up batch is renumbered anyway

    # ------------------------------------------------------------------ appending

    def append(self, tp: TopicPartition, timestamp: int, key, value, headers, cookie: Any, now_ms: int):
        """Queue one record. Returns (batch, new batch opened) or None if buffer.memory is full."""
        self.check_accepting(tp)
        return self.acc.append(tp, timestamp, key, value, headers, cookie, now_ms)

    def append_encoded(self, tp: TopicPartition, records, count: int, base_ts: int, max_ts: int,
                       cookie: Any, now_ms: int):
        """Queue a caller-encoded records section as one batch; None if buffer.memory is full."""
        self.check_accepting(tp)
        return self.acc.append_encoded(tp, records, count, base_ts, max_ts, cookie, now_ms)

    def check_accepting(self, tp: TopicPartition) -> None:
        """Raise the producer's fatal error, or the partition's topic's, if there is one."""
        if self.fatal:
            raise self.fatal
        err = self.topic_errors.get(tp.topic)
        if err is not None:
            raise err

    # ------------------------------------------------------------------ sending

    def ready(self, now_ms: int) -> tuple[set[int], int | None, bool]:
        """Nodes with something sendable, the next time something may become sendable, and whether
        a partition has no known leader."""
        nodes: set[int] = set()
        next_ms: int | None = None
        unknown_leader = False
        if self.fatal:
            return nodes, None, False
        for tp, q in self.acc.queues.items():
            if not q:
                continue
            ps = self._state(tp)
            if ps.leader < 0:
                unknown_leader = True
                continue
            if ps.leader in nodes:
                continue
            b = q[0]
            if self.acc.is_sendable(b, q, now_ms):
                if self._may_send(b, ps):
                    nodes.add(ps.leader)
            else:
                t = self.acc.next_ready_ms(b)
                next_ms = t if next_ms is None else min(next_ms, t)
        return nodes, next_ms, unknown_leader

    def can_send_to(self, node: int) -> bool:
        return self.node_in_flight.get(node, 0) < self.config.max_in_flight

    def _may_send(self, b: ProducerBatch, ps: PartitionState) -> bool:
        if self.txn is not None and not self.txn.may_send(b.tp):
            return False   # not (yet) added to the transaction: AddPartitionsToTxn first
        if ps.limit_reached(b):
            return False
        if not ps.idempotent:
            return True
        if self.producer_id < 0:
            return False
        if ps.rewrite_from is not None and (not b.has_sequence or self._renumbered(b, ps)):
            # b waits for the renumbering; the batches before the gap go first, under their
            # old sequences, alone (they may be in the log: renumbered, they could be twice)
            if (ps.gap or self.bump_requested or self.init_pid_in_progress or ps.in_flight
                    or ps.unacked and seq_before(ps.unacked[0].base_sequence, ps.rewrite_from)):
                return False
            self._renumber(ps)
        if b.has_sequence:
            if b.needs_head_of_line:
                return ps.in_flight == 0 and bool(ps.unacked) and ps.unacked[0] is b
            return True
        if ps.retrying or ps.unresolved is not None:
            return False   # a new sequence waits until the earlier ones are settled
        if (ps.producer_id, ps.producer_epoch) != (self.producer_id, self.producer_epoch) and ps.unacked:
            return False  # old-epoch batches must settle before sequence 0 of the new epoch
        return True

    @staticmethod
    def _renumbered(b: ProducerBatch, ps: PartitionState) -> bool:
        """b's sequence is void: it will be (or was) renumbered under a new epoch or a reset."""
        return (b.producer_epoch != ps.producer_epoch or b.producer_id != ps.producer_id
                or ps.rewrite_from is not None and not seq_before(b.base_sequence, ps.rewrite_from))

    @staticmethod
    def _proven(b: ProducerBatch, ps: PartitionState) -> bool:
        """A later batch of b's epoch was acknowledged: the broker appends in sequence order, so
        b is in the log (its offset is not known here)."""
        return (ps.last_acked_sequence >= 0 and b.producer_epoch == ps.producer_epoch
                and b.producer_id == ps.producer_id
                and not seq_before(ps.last_acked_sequence, b.last_sequence))

    def _renumber(self, ps: PartitionState) -> None:
        """After a bump or reset: unacknowledged batches restart at 0 under the current id/epoch."""
        ps.producer_id, ps.producer_epoch = self.producer_id, self.producer_epoch
        seq = 0
        for i, b in enumerate(ps.unacked):
            b.set_producer_state(self.producer_id, self.producer_epoch, seq)
            b.needs_head_of_line = False
            b.ordinal = i
            seq = increment(seq, b.count)
        ps.next_sequence = seq
        ps.next_ordinal = len(ps.unacked)
        ps.last_acked_sequence = -1
        ps.retrying = 0
        ps.rewrite_from = None
        ps.unresolved = None
        ps.gap = False

    def _assign_sequence(self, b: ProducerBatch, ps: PartitionState) -> None:
        if not ps.idempotent:
            if b.producer_id != -1 or b.has_sequence:
                b.set_producer_state(-1, -1, -1)
            return
        if (ps.producer_id, ps.producer_epoch) != (self.producer_id, self.producer_epoch):
            ps.producer_id, ps.producer_epoch = self.producer_id, self.producer_epoch
            ps.next_sequence = 0
            ps.next_ordinal = 0
            ps.last_acked_sequence = -1
        b.ordinal = ps.next_ordinal
        ps.next_ordinal += 1
        b.set_producer_state(self.producer_id, self.producer_epoch, ps.next_sequence)
        ps.next_sequence = increment(ps.next_sequence, b.count)
        ps.unacked.append(b)
        ps.unacked_records += b.count

    def drain(self, node: int, now_ms: int) -> list[ProducerBatch]:
        """Batches for one request to `node` (at most one per partition), each checked against
        both in-flight limits. Counts the request as in flight if non-empty."""
        if not self.can_send_to(node) or self.fatal:
            return []
        out: list[ProducerBatch] = []
        size = 0
        items = list(self.acc.queues.items())
        n = len(items)
        if not n:
            return out
        # rotate the start so that max.request.size never starves the same partitions
        start = self._drain_start % n
        self._drain_start += 1
        for i in range(n):
            tp, q = items[(start + i) % n]
            if not q:
                continue
            ps = self._state(tp)
            if ps.leader != node:
                continue
            b = q[0]
            if not self.acc.is_sendable(b, q, now_ms) or not self._may_send(b, ps):
                continue
            if out and size + b.size > self.config.max_request_size:
                break
            q.popleft()
            if not b.has_sequence or not ps.idempotent:
                self._assign_sequence(b, ps)
            b.encode()
            b.node = node
            b.sent_ms = now_ms
            ps.in_flight += 1
            if ps.in_flight > ps.max_in_flight_seen:
                ps.max_in_flight_seen = ps.in_flight
            size += b.size
            out.append(b)
        if out:
            self.node_in_flight[node] = self.node_in_flight.get(node, 0) + 1
            if self.config.acks == 0:
                self._complete_unacknowledged(node, out)
            else:
                self.on_wire.update(out)
        return out

    def _complete_unacknowledged(self, node: int, batches: list[ProducerBatch]) -> None:
        self.node_in_flight[node] -= 1
        for b in batches:
            self._state(b.tp).in_flight -= 1
            self._finish(b, None, None)

    # ------------------------------------------------------------------ responses

    def on_response(self, node: int, results: Iterable[tuple[ProducerBatch, PartitionResult]],
                    now_ms: int) -> None:
        self.node_in_flight[node] = self.node_in_flight.get(node, 1) - 1
        on_wire = self.on_wire
        for b, r in results:
            ps = self._state(b.tp)
            ps.in_flight -= 1
            on_wire.discard(b)
            if b.node == ps.leader and (r.batches_to_retain != ps.reported_window
                                        or r.max_inflight_sequences != ps.reported_threshold):
                self._learn(b.tp, ps, r)
            self._handle_result(b, ps, r, now_ms)

    def on_request_failed(self, node: int, batches: list[ProducerBatch], now_ms: int,
                          reason: str = "connection lost") -> None:
        """No response (disconnect, timeout): outcome unknown, so retry under the same sequence."""
        self.node_in_flight[node] = self.node_in_flight.get(node, 1) - 1
        self.metadata_refresh_needed = True
        for b in batches:
            ps = self._state(b.tp)
            ps.in_flight -= 1
            self.on_wire.discard(b)
            b.maybe_written = True
            self._retry_or_fail(b, ps, now_ms, BrokerResponseError(E.NETWORK_EXCEPTION, reason))

    def _handle_result(self, b: ProducerBatch, ps: PartitionState, r: PartitionResult, now_ms: int) -> None:
        code = r.error_code
        if code == 0:
            self._ack(b, ps, r.base_offset, r.log_append_time)
            return
        if code == E.DUPLICATE_SEQUENCE_NUMBER:
            self.stats["duplicates"] += 1
            self._ack(b, ps, None, -1)
            return
        if b.done:
            return
        if code not in _NOT_APPENDED:
            b.maybe_written = True
        if self.fatal is not None:
            self._finish_unacked(b, ps, self.fatal)
            return
        topic_error = self.topic_errors.get(b.tp.topic)
        if topic_error is not None:   # required, and the topic turned out not to support it
            self._finish_unacked(b, ps, topic_error)
            return
        err = BrokerResponseError(code, r.error_message)
        if code == E.OUT_OF_ORDER_SEQUENCE_NUMBER and ps.idempotent and b.has_sequence:
            if self._proven(b, ps):
                self._ack(b, ps, None, -1)   # acknowledged after all: a later batch was
                return
            if not self._renumbered(b, ps) and (
                    b.base_sequence == increment(ps.last_acked_sequence, 1)
                    or b.base_sequence == ps.unresolved):
                msg = (f"OutOfOrderSequence on the batch right after the last acknowledged sequence "
                       f"{ps.last_acked_sequence} (offset {ps.last_acked_offset}): the broker lost "
                       f"acknowledged records or never got this batch's predecessor")
                if b.base_sequence == ps.unresolved:
                    msg = (f"OutOfOrderSequence on the batch right after one given up at sequence "
                           f"{ps.unresolved - 1}: that one is not in the log")
                elif self.config.acks == 1:
                    msg += " (acks=1: records may have been lost with a leader)"
                self._request_bump(b.tp, msg, b.base_sequence)
            self._retry_or_fail(b, ps, now_ms, err, count=False)
            return
        if code == E.UNKNOWN_PRODUCER_ID and ps.idempotent and b.has_sequence:
            lso = r.log_start_offset
            if self._proven(b, ps):
                self._ack(b, ps, None, -1)
            elif lso == -1 or self._renumbered(b, ps):
                self._retry_or_fail(b, ps, now_ms, err, count=False)
            elif lso > ps.last_acked_offset:
                self._request_reset(b.tp, f"UnknownProducerId after retention (log start offset "
                                          f"{lso} > last acknowledged offset {ps.last_acked_offset})",
                                    b.base_sequence)
                self._retry_or_fail(b, ps, now_ms, err, count=False)
            else:
                self.go_fatal(DataLossError(
                    b.tp.topic, b.tp.partition,
                    f"UNKNOWN_PRODUCER_ID although log start offset {lso} <= last acknowledged "
                    f"offset {ps.last_acked_offset}: the broker lost this producer's state while "
                    f"its records should still be there; acknowledged records at offsets "
                    f"{lso}..{ps.last_acked_offset} may be lost"))
                assert self.fatal is not None  # go_fatal above set it
                self._finish_unacked(b, ps, self.fatal)
            return
        if code == E.UNSUPPORTED_FOR_MESSAGE_FORMAT and b.producer_id >= 0:
            # sent with a producer id to a topic whose format is older than v2: `required`
            # fails the topic (above, from now on), `requested` sends it again without one
            self.topic_message_format(b.tp.topic, False)
            topic_error = self.topic_errors.get(b.tp.topic)
            if topic_error is not None:
                self._finish_unacked(b, ps, topic_error)
            else:
                self._retry_or_fail(b, ps, now_ms, err, count=False)
            return
        if code in _FATAL and not (self.txn is not None and code in _TXN_ABORTABLE):
            msg = f"{b.tp.topic}-{b.tp.partition}: {err}"
            self.go_fatal(ProducerFencedError(msg, code) if code in (E.PRODUCER_FENCED,
                                                                     E.INVALID_PRODUCER_EPOCH)
                          else ProducerFatalError(msg))
            assert self.fatal is not None  # go_fatal above set it
            self._finish_unacked(b, ps, self.fatal)
            return
        if code in _REFRESH_METADATA:
            self.metadata_refresh_needed = True
            cl = r.current_leader
            if cl is not None and code in _NEW_LEADER and cl[0] >= 0 and cl[1] > ps.leader_epoch:
                self.update_leader(b.tp, cl[0], cl[1])   # KIP-951: no wait for Metadata
        if code in RETRIABLE:
            self._retry_or_fail(b, ps, now_ms, err)
        else:
            self._give_up(b, ps, err)

    def _drop_sequences(self, ps: PartitionState) -> None:
        ps.idempotent = False
        for ub in ps.unacked:
            ub.needs_head_of_line = False
        ps.unacked.clear()
        ps.unacked_records = 0
        ps.retrying = 0
        ps.rewrite_from = None
        ps.unresolved = None

    def _retry_or_fail(self, b: ProducerBatch, ps: PartitionState, now_ms: int, err: BaseException,
                       count: bool = True) -> None:
        if b.done:
            return
        if self.fatal is not None:
            self._finish_unacked(b, ps, self.fatal)
            return
        if self.topic_errors and b.tp.topic in self.topic_errors:
            self._finish_unacked(b, ps, self.topic_errors[b.tp.topic])
            return
        if ps.gap and b.has_sequence and self._renumbered(b, ps):
            self._give_up(b, ps, err)   # after a gap, in a transaction: sent only after an abort
            return
        if count:
            b.attempts += 1
        else:
            b.attempts = max(b.attempts, 1)
        expired = now_ms - b.created_ms >= self.config.delivery_timeout_ms
        if expired or b.attempts > self.config.retries:
            self._give_up(b, ps, DeliveryTimeoutError(
                f"{b.tp.topic}-{b.tp.partition}: {b.count} records not delivered within "
                f"delivery.timeout.ms={self.config.delivery_timeout_ms}; last error: {err}")
                if expired else err)
            return
        b.retry_at_ms = now_ms + self.config.retry_backoff_ms
        b.last_error = err
        self.stats["retries"] += 1
        # as Java's producer, each retry with its error (KAFKA_STORAGE_ERROR of a full disk,
        # NOT_LEADER ...), but a few a minute per error: every batch of every partition retries
        # alike. The knock-on answers of the batches behind a failed one (OutOfOrderSequence,
        # not counted as attempts) would only hide the cause: DEBUG.
        if count:
            limit = self._retry_logs.setdefault(str(getattr(err, "code", type(err).__name__)),
                                                LogLimit(burst=3, period_s=30.0))
            write, held = limit.allow(now_ms / 1000)
        else:
            write, held, limit = False, 0, None
        if write or retry_log.isEnabledFor(logging.DEBUG):
            retry_log.log(logging.WARNING if write else logging.DEBUG,
                          "%s-%d: %d records answered %s, retrying (attempt %d, %d ms left of "
                          "delivery.timeout.ms)%s", b.tp.topic, b.tp.partition, b.count, err, b.attempts,
                          max(0, self.config.delivery_timeout_ms - (now_ms - b.created_ms)),
                          held_back(held, limit.period_s) if limit is not None else "")
        if ps.idempotent and b.has_sequence and not b.needs_head_of_line and b in ps.unacked:
            b.needs_head_of_line = True
            ps.retrying += 1
        self.acc.reenqueue(b)

    def _give_up(self, b: ProducerBatch, ps: PartitionState, err: BaseException) -> None:
        """b fails for good (delivery timeout, retries used up, a non-retriable answer). If it
        had a sequence, what became of it decides what happens to the batches after it: nothing
        if it was written, a renumbering if it was not, and if nobody knows, they are asked."""
        if not (ps.idempotent and b.has_sequence and b in ps.unacked):
            self._finish(b, err, None)
            return
        self._remove_unacked(b, ps)
        if self._proven(b, ps):
            self._finish(b, None, None)
            return
        if not self._renumbered(b, ps):
            if b.maybe_written:
                self.stats["given_up"] += 1
                after = increment(b.last_sequence, 1)
                if ps.unresolved is None or seq_before(ps.unresolved, after):
                    ps.unresolved = after
            else:   # refused on every attempt: a gap for certain
                self._request_bump(b.tp, f"batch {b.base_sequence}..{b.last_sequence} failed "
                                         f"({err})", b.base_sequence)
        self._finish(b, err, None)
        self._settle(b.tp, ps)

    def _settle(self, tp: TopicPartition, ps: PartitionState) -> None:
        """Resolve the partition's unresolved sequence if something tells what became of it."""
        u = ps.unresolved
        if u is None:
            return
        if ps.last_acked_sequence >= 0 and not seq_before(ps.last_acked_sequence, decrement(u, 1)):
            ps.unresolved = None   # a later batch was acknowledged: the given-up one is in the log
            self.stats["resolved"] += 1
            return
        for x in ps.unacked:   # in sequence order; only while unresolved (rare), so a scan is fine
            if not seq_before(x.base_sequence, u):
                if ps.rewrite_from is None or seq_before(x.base_sequence, ps.rewrite_from):
                    return   # x, retried under its sequence, will tell
                break
        # nothing left to ask with: assume the worst (a gap), as Java's maybeResolveSequences does
        # (the records were failed already, as possibly written: no news for the operator)
        self._request_bump(tp, f"no batch left to tell whether sequences before {u} were written", u,
                           logging.INFO)

    def _finish_unacked(self, b: ProducerBatch, ps: PartitionState, err: BaseException) -> None:
        if b in ps.unacked:
            self._remove_unacked(b, ps)
        self._finish(b, err, None)

    def _remove_unacked(self, b: ProducerBatch, ps: PartitionState) -> None:
        ps.unacked.remove(b)
        ps.unacked_records -= b.count
        if b.needs_head_of_line:
            b.needs_head_of_line = False
            ps.retrying -= 1

    def _ack(self, b: ProducerBatch, ps: PartitionState, base_offset: int | None, log_append_time: int) -> None:
        if b.done:
            return
        if ps.idempotent and b.has_sequence and b in ps.unacked:
            self._remove_unacked(b, ps)
            if b.producer_epoch == ps.producer_epoch and (
                    ps.last_acked_sequence < 0 or seq_before(ps.last_acked_sequence, b.last_sequence)):
                ps.last_acked_sequence = b.last_sequence
                if ps.unresolved is not None:
                    self._settle(b.tp, ps)
        if base_offset is not None:
            if base_offset < 0:
                base_offset = None   # a broker that did not say where (Kafka's -1): unknown
            else:
                ps.last_acked_offset = max(ps.last_acked_offset, base_offset + b.count - 1)
        self._finish(b, None, base_offset, log_append_time)

    def _finish(self, b: ProducerBatch, err: BaseException | None, base_offset: int | None,
                log_append_time: int = -1, notify: bool = True) -> None:
        b.done = True
        self.acc.release(b)
        if err is not None and b.maybe_written:
            err = possibly_written(err)
        self.completions.append(Completion(b, err, base_offset, log_append_time))
        if err is not None and notify and self.txn is not None:
            self.txn.on_batch_failed(b.tp, err)

    # ------------------------------------------------------------------ time and failure

    def expire(self, now_ms: int) -> None:
        """Fail queued batches older than delivery.timeout.ms."""
        limit = self.config.delivery_timeout_ms
        for tp, q in self.acc.queues.items():
            while q and now_ms - q[0].created_ms >= limit:
                b = q.popleft()
                self._give_up(b, self._state(tp), DeliveryTimeoutError(
                    f"{tp.topic}-{tp.partition}: {b.count} records not delivered within "
                    f"delivery.timeout.ms={limit}"
                    + (f"; last error: {b.last_error}" if b.last_error is not None else "")))

    def go_fatal(self, err: BaseException) -> None:
        """The producer cannot go on: every queued record fails with `err`, and so will anything
        sent from now on (batches on the wire are left to their answers)."""
        if self.fatal is None:
            log.error("producer failed: %s", err)
            self.fatal = err
        self.fail_queued(err)

    def fail_queued(self, err: BaseException) -> None:
        """Fail everything queued (batches on the wire are left to their answers)."""
        for tp, q in self.acc.queues.items():
            if q:
                ps = self._state(tp)
                while q:
                    self._finish_unacked(q.popleft(), ps, err)

    def fail_all(self, err: BaseException, unknown: BaseException | None = None) -> None:
        """Close without waiting (Java's abortIncompleteBatches): every record still held fails
        now, those never sent with `err`, those that may have been written (on the wire, or sent
        before and queued for a retry) with `unknown` (default `err`), flagged possibly written.
        A late answer finds them done and is ignored."""
        unknown = err if unknown is None else unknown
        for q in self.acc.queues.values():
            while q:
                b = q.popleft()
                self._finish_unacked(b, self._state(b.tp), unknown if b.maybe_written else err)
        for b in list(self.on_wire):
            if not b.done:
                b.maybe_written = True
                self._finish_unacked(b, self._state(b.tp), unknown)
        self.on_wire.clear()

    # ------------------------------------------------------------------ transactions (txn_core)

    def attach_transactions(self, txn: TransactionManager) -> None:
        self.txn = txn

    def start_epoch(self, producer_id: int, producer_epoch: int) -> None:
        """An id/epoch from the transaction coordinator (init_transactions, the bump after an
        abort, every EndTxn under Transactions V2): every partition's sequences restart at 0
        (Java's resetSequenceNumbers). Called with no batch incomplete, so nothing on the wire is
        renumbered."""
        self.on_producer_id(producer_id, producer_epoch, routine=True)
        for ps in self.partitions.values():
            if ps.idempotent:
                self._renumber(ps)

    def has_incomplete(self) -> bool:
        """A batch is queued or on the wire: its outcome is not known yet."""
        return self.acc.has_unsent() or bool(self.on_wire)

    def abort_undrained(self, err: BaseException) -> None:
        """The transaction is being aborted: fail the queued batches never sent under a sequence
        that is still valid (Java's abortUndrainedBatches). Retries keep their place: they may be
        in the log and must be resolved before EndTxn."""
        for tp, q in self.acc.queues.items():
            if not q:
                continue
            ps = self._state(tp)
            keep: deque = deque()
            while q:
                b = q.popleft()
                if b.has_sequence and not (ps.gap and self._renumbered(b, ps)):
                    keep.append(b)
                else:
                    if b in ps.unacked:
                        self._remove_unacked(b, ps)
                    self._finish(b, err, None, notify=False)
            q.extend(keep)

    def incomplete_batches(self) -> set[ProducerBatch]:
        """Every batch not yet completed: queued, or on the wire (what a flush waits for; the
        completions not yet taken are not in it)."""
        pending = {b for q in self.acc.queues.values() for b in q}
        pending.update(b for b in self.on_wire if not b.done)
        return pending

    def partition_load(self, tps: list[TopicPartition]) -> tuple[list[int], list[int]]:
        """Batches queued per partition of `tps` that has a leader, and those partitions' numbers
        (KIP-794's adaptive partitioning). Read without the lock from a sending thread: a
        slightly stale count only skews a draw."""
        queues = self.acc.queues
        states = self.partitions
        queued, ids = [], []
        for tp in tps:
            ps = states.get(tp)
            if ps is not None and ps.leader < 0:
                continue
            q = queues.get(tp)
            queued.append(len(q) if q else 0)
            ids.append(tp.partition)
        return queued, ids

    def take_completions(self) -> list[Completion]:
        c, self.completions = self.completions, []
        return c

    def has_pending(self) -> bool:
        return self.acc.has_unsent() or any(n > 0 for n in self.node_in_flight.values())

    def in_flight_to(self, node: int) -> int:
        return self.node_in_flight.get(node, 0)
