"""Committed offsets of every group this broker coordinates, classic and KIP-848 alike (they share
group ids, offsets and the store), and transactional offsets (KIP-447).

- OffsetCommit: a consumer group's commit is checked by its member epoch (`consumer_groups`), a
  classic group's by its generation and state (`core.groups.classic.ClassicGroups.commit_error`);
  a commit to a group nobody knows creates an offsets-only classic group (a consumer using
  `assign`). A commit appends the records of its partitions to the group's offset log
  (`storage.group_offsets`), and is answered once the group commit's fsync, off the event loop,
  covered them (`record_sync`): its work is in proportion to the partitions it names, not to the
  offsets the group holds, and other clients are served while the disk works (issue 36).
- Retention (`offsets.retention.minutes`): offsets outlive an empty group for that long counted from
  when it became empty; offsets of a group without members (commits from `assign` users) expire by
  commit time, and a Stable consumer group (classic protocol `consumer`, or KIP-848) loses only
  offsets of topics it no longer subscribes to. An offset with a transactional commit pending for
  its partition stays.
- TxnOffsetCommit: kept pending, durable, until the transaction's marker on the group's
  `__consumer_offsets` partition, which makes them visible (COMMIT) or drops them (ABORT); written
  and answered as a commit is (appended to the producer's pending log there).
A file that cannot be written is answered NOT_COORDINATOR (`storage_failed`).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from oncelog.broker.groups.consumer_groups import ConsumerGroupCoordinator
from oncelog.broker.groups.record_sync import RecordSync
from oncelog.core.groups.classic import ClassicGroups
from oncelog.core.groups.classic_group import CONSUMER_PROTOCOL, EMPTY, STABLE
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC
from oncelog.core.txn.state import TV_2
from oncelog.core.txn.verification import voids
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.fence import Busy, Fenced
from oncelog.storage.group_offsets import Committed, Frame, GroupOffsetStore, offset_frames, pending_frames

log = logging.getLogger(__name__)
E = ErrorCode
# a commit's records are framed in parts of about this many bytes of metadata, the event loop
# serving other requests between two (2,000 offsets of 4 KB metadata are 8 MB of records)
FRAMING_STEP_BYTES = 256 << 10


class TxnCommitCheck:
    """One TxnOffsetCommit waiting for its verification, at `epoch` (`v2`: Transactions V2)."""

    __slots__ = ("epoch", "v2", "valid")

    def __init__(self, epoch: int, v2: bool) -> None:
        self.epoch, self.v2, self.valid = epoch, v2, True


class GroupOffsets:
    def __init__(self, store: GroupOffsetStore, now_ms: Callable[[], int], classic: ClassicGroups,
                 consumer: ConsumerGroupCoordinator, *, retention_ms: int, retention_check_interval_ms: int,
                 producer_id_expiration_ms: int, started_ms: int, sync: RecordSync | None = None) -> None:
        """`started_ms`: when the coordinator started, the commit time of offsets stored without one;
        `sync`: the group commit the durable variants wait on."""
        self.store = store
        self.sync = sync or RecordSync(now_ms)
        self.now_ms = now_ms
        self.classic = classic
        self.consumer = consumer
        self.retention_ms = retention_ms
        self.retention_interval_ms = retention_check_interval_ms
        self.producer_expiration_ms = producer_id_expiration_ms
        self.started_ms = started_ms
        self._next_retention_ms = started_ms + retention_check_interval_ms
        self._txn_guards: dict[int, list[TxnCommitCheck]] = {}  # producer id -> TxnOffsetCommits waiting

    # ------------------------------------------------------------------ offsets
    def commit(self, group_id: str, generation: int, member_id: str,
               offsets: dict[tuple[str, int], Committed], instance_id: str | None = None,
               retention_ms: int = -1, api_version: int = 8, sync: bool = True,
               frames: list[Frame] | None = None) -> int:
        """`retention_ms`: OffsetCommit v2-v4's retention time (-1: `offsets.retention.minutes`);
        `generation`: a consumer group member's epoch (v9+). `sync=False`: written, not yet
        fsynced (`commit_durably` waits for that). `frames`: the stamped offsets' records
        (`commit_durably`)."""
        cg = self.consumer.group(group_id)
        if cg is not None:
            error = self.consumer.validate_commit(cg, member_id, generation, api_version, offsets)
            return error or self._store_commit(group_id, offsets, retention_ms, sync, frames)
        g = self.classic.group(group_id)
        if g is None:
            if generation >= 0:  # a member of a generation this coordinator does not know
                return E.GROUP_ID_NOT_FOUND if api_version >= 9 else E.ILLEGAL_GENERATION
            g = self.classic.new_group(group_id, self.now_ms())  # offsets only: a consumer using assign()
        error = self.classic.commit_error(g, generation, member_id, instance_id, self.now_ms())
        return error or self._store_commit(group_id, offsets, retention_ms, sync, frames)

    async def commit_durably(self, group_id: str, generation: int, member_id: str,
                             offsets: dict[tuple[str, int], Committed], instance_id: str | None = None,
                             retention_ms: int = -1, api_version: int = 8) -> int:
        """`commit`, answered once the group commit's fsync covered it (NOT_COORDINATOR if that
        failed: the client finds the coordinator again and retries). The records are made first,
        in parts between which other requests are served; then the commit is checked and written
        in one step, as Kafka checks and appends under the group's lock."""
        stamped = self._stamped(offsets, retention_ms)
        frames = await _in_parts(stamped, offset_frames)
        if not self.consumer.owns(group_id):   # moved to another broker meanwhile
            return E.NOT_COORDINATOR
        error = self.commit(group_id, generation, member_id, stamped, instance_id, retention_ms, api_version,
                            sync=False, frames=frames)
        if error:
            return error
        return E.NONE if await self.flushed(group_id) else E.NOT_COORDINATOR

    async def flushed(self, group_id: str) -> bool:
        """Whether every offset written to the group so far is on disk (waiting for it if not);
        False if its fsync failed (what memory held is read again from the file, which the
        failure cut back)."""
        log_ = self.store.offsets_log(group_id)
        if log_ is not None and log_.offline:
            self.store.get(group_id)   # read again: what a failure left
            log_ = self.store.offsets_log(group_id)
        return await self.sync.flushed(log_)

    def _stamped(self, offsets: dict[tuple[str, int], Committed],
                 retention_ms: int) -> dict[tuple[str, int], Committed]:
        """The offsets with their commit time (and OffsetCommit v2-v4's expiry)."""
        now = self.now_ms()
        expire = now + retention_ms if retention_ms >= 0 else -1
        return {k: c._replace(commit_timestamp=now, expire_timestamp=expire) for k, c in offsets.items()}

    def _store_commit(self, group_id: str, offsets: dict[tuple[str, int], Committed], retention_ms: int,
                      sync: bool = True, frames: list[Frame] | None = None) -> int:
        try:
            if frames is None:
                self.store.commit(group_id, self._stamped(offsets, retention_ms), sync)
            else:   # stamped already
                self.store.commit(group_id, offsets, sync, frames)
        except OSError as e:
            return storage_failed(group_id, "offset commit", e)
        return E.NONE

    def committed(self, group_id: str) -> dict[tuple[str, int], Committed]:
        return self.store.get(group_id)

    def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]
                       ) -> tuple[int, dict[tuple[str, int], int]]:
        """OffsetDelete (Kafka's GroupCoordinator.handleDeleteOffsets): (group error, error per
        partition). An empty group loses any of its offsets; a consumer group with members only
        those of topics none of them subscribes to (GROUP_SUBSCRIBED_TO_TOPIC for the others,
        and for all when the subscriptions are unknown, as Kafka's isSubscribedToTopic is false
        then); a group of another protocol with members refuses (NON_EMPTY_GROUP)."""
        cg = self.consumer.group(group_id)
        g = self.classic.group(group_id) if cg is None else None
        if g is not None:
            self.classic.expire_sessions(g, self.now_ms())
        subscribed: frozenset[str]
        if cg is not None:  # Kafka's ConsumerGroup: only topics no member subscribes to
            subscribed = cg.subscribed_names()
        elif g is None:
            return E.GROUP_ID_NOT_FOUND, {}
        elif g.state == EMPTY:
            subscribed = frozenset()
        elif g.protocol_type == CONSUMER_PROTOCOL:
            subscribed = g.subscribed or frozenset()
        else:
            return E.NON_EMPTY_GROUP, {}
        deletable = [tp for tp in partitions if tp[0] not in subscribed]
        errors: dict[tuple[str, int], int] = {tp: E.GROUP_SUBSCRIBED_TO_TOPIC for tp in partitions
                                              if tp[0] in subscribed}
        committed = self.store.get(group_id)
        gone = [tp for tp in deletable if tp in committed]
        if gone:
            self.store.remove(group_id, gone)
            log.info("group %s: committed offsets of %d partitions deleted (OffsetDelete)", group_id, len(gone))
        errors.update({tp: E.NONE for tp in deletable})
        return E.NONE, errors

    def delete_topic(self, topic: str) -> None:
        """A deleted topic's committed offsets go with it (Kafka's handleDeletedPartitions)."""
        self.store.delete_topic(topic)

    # ------------------------------------------------------------------ retention (the broker's tick)
    def tick(self, now: int) -> None:
        """Every `offsets.retention.check.interval.ms`: expired offsets, and idle producers' offsets
        state."""
        if now >= self._next_retention_ms:
            self._next_retention_ms = now + self.retention_interval_ms
            self.expire_offsets(now)
            self.store.expire_producers(now, self.producer_expiration_ms)

    def expire_offsets(self, now: int) -> int:
        """Kafka's GroupMetadata.removeExpiredOffsets for every group this broker coordinates; a
        group left empty without offsets is forgotten, its record too. An offset with a
        transactional commit pending for its partition stays (Kafka's rule). Returns how many
        offsets expired."""
        removed = 0
        pending: dict[str, set[tuple[str, int]]] = {}
        for groups in self.store.pending().values():
            for group_id, offsets in groups.items():
                pending.setdefault(group_id, set()).update(offsets)
        for group_id, g in list(self.classic.groups.items()):
            held = pending.get(group_id, set())
            offsets = {k: c for k, c in self.store.get(group_id).items() if k not in held}
            ptype = g.protocol_type
            if ptype is not None and g.state == EMPTY:
                gone = [k for k, c in offsets.items() if self._expired(c, g.state_since_ms, now)]
            elif ptype == CONSUMER_PROTOCOL and g.state == STABLE and g.subscribed is not None:
                gone = [k for k, c in offsets.items()
                        if k[0] not in g.subscribed and self._expired(c, self._committed_at(c), now)]
            elif ptype is None:
                gone = [k for k, c in offsets.items() if self._expired(c, self._committed_at(c), now)]
            else:
                gone = []
            if gone:
                log.info("group %s: %d committed offsets expired (offsets.retention.minutes)",
                         group_id, len(gone))
                self.store.remove(group_id, gone)
                removed += len(gone)
            if (g.state == EMPTY and not g.members and not g.pending and not held
                    and not self.store.get(group_id)):
                del self.classic.groups[group_id]
                self.store.remove(group_id)
        for group_id, cg in list(self.consumer.groups.items()):
            # Kafka's ConsumerGroup: by commit time, for topics no member subscribes to
            held = pending.get(group_id, set())
            subscribed = cg.subscribed_names()
            gone = [k for k, c in self.store.get(group_id).items()
                    if k not in held and k[0] not in subscribed and self._expired(c, self._committed_at(c), now)]
            if gone:
                log.info("group %s: %d committed offsets expired (offsets.retention.minutes)", group_id, len(gone))
                self.store.remove(group_id, gone)
                removed += len(gone)
            if not cg.members and not held and not self.store.get(group_id):
                self.consumer.forget(group_id)
                self.store.remove(group_id)
        return removed

    def _expired(self, c: Committed, base_ms: int, now: int) -> bool:
        if c.expire_timestamp >= 0:  # OffsetCommit v2-v4 asked for its own retention
            return now >= c.expire_timestamp
        return now - base_ms >= self.retention_ms

    def _committed_at(self, c: Committed) -> int:
        return c.commit_timestamp if c.commit_timestamp >= 0 else self.started_ms

    # ------------------------------------------------------------ transactional offsets
    def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int, generation: int, member_id: str,
                   instance_id: str | None, offsets: dict[tuple[str, int], Committed], sync: bool = True,
                   frames: list[Frame] | None = None) -> int:
        """TxnOffsetCommit (KIP-447): kept pending, durable, until the transaction's marker; an
        epoch older than the group's offsets partition knows of the producer is
        INVALID_PRODUCER_EPOCH. `sync=False`: written, not yet fsynced (`txn_commit_durably`)."""
        cg = self.consumer.group(group_id)
        if generation >= 0 or member_id or instance_id is not None:
            # Member data (v3+): validated as a commit is; without it (v0-2, aiokafka, kafkajs)
            # Kafka skips validation for transactional commits, and so no zombie fencing.
            if cg is not None:  # a member epoch (a stale one is answered ILLEGAL_GENERATION)
                error = self.consumer.validate_commit(cg, member_id, generation, None, offsets)
                if error:
                    return error
                return self._store_txn_commit(group_id, producer_id, producer_epoch, offsets, sync, frames)
            g = self.classic.group(group_id)
            if g is None:
                return E.ILLEGAL_GENERATION if generation >= 0 else E.UNKNOWN_MEMBER_ID
            error = self.classic.validate_commit(g, generation, member_id, instance_id)
            if error:
                return error
        return self._store_txn_commit(group_id, producer_id, producer_epoch, offsets, sync, frames)

    async def txn_records(self, group_id: str, offsets: dict[tuple[str, int], Committed]
                          ) -> tuple[dict[tuple[str, int], Committed], list[Frame]]:
        """A TxnOffsetCommit's offsets with their commit time, and their records, made in parts
        between which other requests are served (as `commit_durably`'s). Before the check that
        the transaction holds the offsets partition: nothing may wait between that check and
        `txn_commit(..., frames=...)`, or a marker could come in between."""
        now = self.now_ms()
        stamped = {k: c._replace(commit_timestamp=now) for k, c in offsets.items()}
        return stamped, await _in_parts(stamped, lambda part: pending_frames(group_id, part))

    async def txn_flushed(self, group_id: str, producer_id: int) -> int:
        """After `txn_commit(..., sync=False)`: NONE once the group commit's fsync covered it,
        NOT_COORDINATOR if that failed. A marker that settled the producer's offsets meanwhile
        rewrote its log whole, durably, with what the commit wrote: that is answered NONE."""
        pending = self.store.pending_log(self.store.partition_of(group_id), producer_id)
        return E.NONE if await self.sync.flushed(pending) else E.NOT_COORDINATOR

    def _store_txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                          offsets: dict[tuple[str, int], Committed], sync: bool = True,
                          frames: list[Frame] | None = None) -> int:
        now = self.now_ms()
        try:
            if frames is None:
                offsets = {k: c._replace(commit_timestamp=now) for k, c in offsets.items()}
            return self.store.add_pending(producer_id, producer_epoch, group_id, offsets, now, sync, frames)
        except OSError as e:
            return storage_failed(group_id, "transactional offset commit", e)

    def begin_txn_commit(self, producer_id: int, producer_epoch: int, v2: bool) -> TxnCommitCheck:
        """A TxnOffsetCommit of `producer_id` is about to wait (for its verification): its check
        stays valid unless a marker for the producer that voids it arrives meanwhile (Kafka's
        VerificationGuard, `core.txn.verification.voids`): the commit then belongs to a
        transaction that already ended, and writing it would leave offsets pending for ever."""
        check = TxnCommitCheck(producer_epoch, v2)
        self._txn_guards.setdefault(producer_id, []).append(check)
        return check

    def end_txn_commit(self, producer_id: int, check: TxnCommitCheck) -> None:
        checks = self._txn_guards.get(producer_id, [])
        if check in checks:
            checks.remove(check)
        if not checks:
            self._txn_guards.pop(producer_id, None)

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                     partition: int, transaction_version: int = 0) -> int:
        """The transaction's marker on `__consumer_offsets-<partition>`, checked as a data partition
        checks a marker (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED, a Transactions V2
        marker not above an open transaction's epoch); taken, COMMIT makes the producer's pending
        offsets of the partition's groups visible and ABORT drops them. Repeating it is harmless
        (nothing is left pending). NOT_LEADER_OR_FOLLOWER when another broker owns the partition
        now (its lease: the marker writer asks the leader again)."""
        try:
            code, why = self.store.apply_marker(producer_id, producer_epoch, coordinator_epoch, commit, partition,
                                                self.now_ms(), transaction_version)
        except (Fenced, Busy) as e:
            log.warning("%s-%d: marker of producer %d not applied: %s", CONSUMER_OFFSETS_TOPIC, partition,
                        producer_id, e)
            return E.NOT_LEADER_OR_FOLLOWER
        except OSError as e:  # retried by the marker writer; the producer's file is written last
            log.error("%s-%d: marker of producer %d not applied: %s", CONSUMER_OFFSETS_TOPIC, partition, producer_id, e)
            return E.KAFKA_STORAGE_ERROR
        if code:
            log.warning("%s marker of producer %d (epoch %d) refused on %s-%d: %s", "COMMIT" if commit else "ABORT",
                        producer_id, producer_epoch, CONSUMER_OFFSETS_TOPIC, partition, why)
            return code
        for check in self._txn_guards.get(producer_id, ()):
            if voids(producer_epoch, transaction_version >= TV_2, check.epoch, check.v2):
                check.valid = False
        return E.NONE

    def unstable(self, group_id: str) -> set[tuple[str, int]]:
        """Partitions of the group with transactional offsets still pending (OffsetFetch v7
        require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        out: set[tuple[str, int]] = set()
        for groups in self.store.pending().values():
            out.update(groups.get(group_id, ()))
        return out


async def _in_parts(offsets: dict[tuple[str, int], Committed],
                   make: Callable[[list[tuple[tuple[str, int], Committed]]], list[Frame]]) -> list[Frame]:
    """`make` over the offsets in parts of about FRAMING_STEP_BYTES of metadata, the event loop
    serving other requests between two (a small commit is made in one go, without a yield)."""
    items = list(offsets.items())
    frames: list[Frame] = []
    start = size = 0
    for i, (_tp, c) in enumerate(items):
        size += 64 + len(c.metadata or "")
        if size >= FRAMING_STEP_BYTES:
            frames += make(items[start:i + 1])
            start, size = i + 1, 0
            await asyncio.sleep(0)
    frames += make(items[start:])
    return frames


def storage_failed(group_id: str, what: str, e: OSError) -> int:
    """A group's file could not be written (the store keeps what it had): the client is told
    NOT_COORDINATOR, Kafka's answer to a storage error on `__consumer_offsets`, so it looks for
    the coordinator again and retries."""
    log.error("group %s: storing the %s failed: %s", group_id, what, e)
    return E.NOT_COORDINATOR
