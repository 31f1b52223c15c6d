"""Share groups on the broker (KIP-932, Kafka 4.2's semantics; docs/share-groups.md): membership
(ShareGroupHeartbeat, decided by `core.share.group`), the share-partitions of each group (decided
by `core.share.partition`, persisted by `storage.share_state`), and share sessions (ShareFetch's
ShareSessionEpoch).

- Membership lives in memory: a member that sends no heartbeat for `group.share.session.timeout.ms`
  is removed and what it holds goes back (as Kafka's share-partition leader releases the records of
  a member that left). A member that leaves (epoch -1) keeps its share session and its records
  until it closes the session (epoch -1 on ShareFetch/ShareAcknowledge, with its last
  acknowledgements: librdkafka's close leaves first) or its locks run out; a session whose member
  is gone and that is not used for a session timeout is closed. After a restart members join
  again (their next heartbeat is answered UNKNOWN_MEMBER_ID, and clients rejoin); what matters
  across a crash is the share-partitions' state, which is persisted.
- A share-partition is loaded (or initialized at `share.auto.offset.reset`: the log end by
  default, the log start with `earliest`) on its first ShareFetch. Locks that run out are taken
  back on the broker's tick and before every decision.
- Durability is a group commit per share group (`_GroupStateSync`, run by the broker's
  `GroupCommit` on threads of its own): a change marks its share-partition dirty and `changed`
  returns the number of the write that will carry it; one write (`storage.share_state`) takes
  the whole state of every dirty share-partition of the group and one fsync makes it durable,
  while the next write gathers what changed meanwhile. A request that changed state (acquired
  records, so that no delivery count is lost and none is delivered past the limit across a crash;
  accepted acknowledgements) is answered only once `durable(group, n)` says its write is on disk.
  A write that fails is answered as failed to those who waited for it, and the next write of the
  group writes every share-partition whole (memory may be ahead of the file after a failure, never
  a write behind a success); while nothing new changes, that rewrite is tried again on the
  broker's tick. So any write that succeeds covers every change made before it began.
- Share sessions are keyed by (group, member id), as Kafka's ShareSessionCache: epoch 0 opens one
  (replacing an older one of the member, whose records go back), -1 closes it (its records go
  back), any other epoch must be the next one (INVALID_SHARE_SESSION_EPOCH; SHARE_SESSION_NOT_FOUND
  without a session). At most `group.share.max.share.sessions` sessions
  (SHARE_SESSION_LIMIT_REACHED beyond; a member of its group opening one closes the least recently
  used session of an id that is no member of its group instead), and a member holds at most
  `group.share.partition.max.record.locks` records of a share-partition (the in-flight bound).
- Dead-letter topics (KIP-1191) are `broker.groups.share_dlq`'s: it tells this coordinator which
  groups have one (`dead_letter`: their share-partitions make REJECTed and limit-archived records
  ARCHIVING, with dead letters kept in their state) and hears when a group's state write is on
  disk (`on_durable`), after which it writes them.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oncelog.broker.logs.fsync_batcher import GroupCommit
from oncelog.core.share.group import ShareAnswer, ShareGroup, ShareHeartbeat, TopicMetadata, heartbeat, leave, validate
from oncelog.core.share.partition import Counts, SharePartition
from oncelog.core.topic_names import invalid_topic_reason
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.fence import Fenced
from oncelog.storage.share_state import Pending, ShareState, ShareStateStore, StaleStateEpoch

log = logging.getLogger(__name__)
E = ErrorCode


@dataclass(frozen=True)
class ShareGroupConfig:
    heartbeat_interval_ms: int = 5000        # group.share.heartbeat.interval.ms
    session_timeout_ms: int = 45000          # group.share.session.timeout.ms
    record_lock_duration_ms: int = 30000     # group.share.record.lock.duration.ms
    delivery_count_limit: int = 5            # group.share.delivery.count.limit
    partition_max_record_locks: int = 2000   # group.share.partition.max.record.locks
    max_size: int = 200                      # group.share.max.size
    max_share_sessions: int = 2000           # group.share.max.share.sessions
    auto_offset_reset: str = "latest"        # share.auto.offset.reset (the group config's default)
    isolation_level: str = "read_uncommitted"   # share.isolation.level (the group config's default)


@dataclass
class ShareSession:
    epoch: int
    partitions: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    last_used_ms: int = 0


SpKey = tuple[str, uuid.UUID, int]   # (group, topic id, partition)
# fsync threads of the share-state group commit (one write of a group in flight at a time)
SYNC_THREADS = 2
# after a failed write, how soon the rewrite of the group's state is tried again when nothing new
# asks for a write (each new change tries at once)
RETRY_MS = 1000
# KIP-1191's group configs (Kafka's GroupConfig.ERRORS_DEADLETTERQUEUE_*): the group's dead-letter
# topic (blank: none) and whether its records carry the original key and value
DLQ_TOPIC_NAME = "errors.deadletterqueue.topic.name"
DLQ_COPY_RECORD = "errors.deadletterqueue.copy.record.enable"
GROUP_CONFIGS = ("share.auto.offset.reset", "share.isolation.level", "share.record.lock.duration.ms",
                 DLQ_TOPIC_NAME, DLQ_COPY_RECORD)


def check_group_config(name: str, value: str) -> None:
    """Kafka's GroupConfig validation of the share-group configs oncelog serves."""
    ok = True
    if name == "share.auto.offset.reset":
        ok = value in ("earliest", "latest")
    elif name == "share.isolation.level":
        ok = value in ("read_committed", "read_uncommitted")
    elif name == "share.record.lock.duration.ms":
        ok = value.isdigit() and int(value) >= 1
    elif name == DLQ_COPY_RECORD:
        ok = value.strip().lower() in ("true", "false")
    elif name == DLQ_TOPIC_NAME:
        check_dlq_topic_name(value)
    else:
        raise KafkaProtocolError(E.INVALID_CONFIG, f"{name} is not a share group config "
                                                   f"(served: {', '.join(GROUP_CONFIGS)})")
    if not ok:
        raise KafkaProtocolError(E.INVALID_CONFIG, f"invalid value {value!r} for {name}")


def check_dlq_topic_name(value: str) -> None:
    """`errors.deadletterqueue.topic.name`: blank (no dead-letter topic), else a topic name that
    does not start with `__` (Kafka's GroupConfig check: the internal topics' prefix), and, beyond
    Kafka (which finds out at the first write), a legal topic name."""
    name = value.strip()
    if not name:
        return
    if name.startswith("__"):
        raise KafkaProtocolError(E.INVALID_CONFIG, f"{DLQ_TOPIC_NAME}: DLQ topic name must not start with '__'")
    reason = invalid_topic_reason(name)
    if reason is not None:
        raise KafkaProtocolError(E.INVALID_CONFIG, f"{DLQ_TOPIC_NAME}: topic name is invalid: {reason}")


class _GroupStateSync:
    """One share group's state log as `GroupCommit` sees a partition: its "offsets" count the
    group's writes. `durable_end_offset` is the last write known to be on disk (with every change
    made before it began), `sync_generation` moves when a write fails (its waiters are told False).
    Storage owns the file (`ShareStateStore.write / sync / synced / sync_failed`); this owns what to
    write and when."""

    @property
    def offline(self) -> bool:
        """GroupCommit: writes still waited for are answered as not stored. A failed write is
        retried, never given up (the group stays writable); only a group deleted, or unloaded
        because another broker coordinates it now, writes nothing more."""
        return self.gone

    def __init__(self, owner: ShareGroupCoordinator, group: str) -> None:
        self.owner, self.group = owner, group
        self.dirty: set[tuple[uuid.UUID, int]] = set()   # share-partitions changed since the last write began
        self.writes = 0                 # writes begun
        self.durable_end_offset = 0
        self.sync_generation = 0
        self.rewrite = False            # a write failed: the next one writes every share-partition whole
        self.retry_at = 0
        self.error: Exception | None = None
        self.gone = False               # deleted, or unloaded (not coordinated here): nothing more is written
        # share-partitions whose state was deleted (DeleteShareGroupOffsets) -> the write that
        # last carried the deletion: written again by every rewrite until one such write succeeds
        self.tombstones: dict[tuple[uuid.UUID, int], int] = {}

    def next_write(self) -> int:
        """The write that will cover every change made so far."""
        return self.writes + 1 if self.dirty or self.rewrite else self.writes

    # ------------------------------------------------------------------ GroupCommit's interface
    def begin_sync(self, now: int) -> tuple[int, Pending] | None:
        if self.gone:
            return None
        if self.rewrite:
            if not self.dirty and now < self.retry_at:
                return None     # a failed disk is not retried in a loop; the tick tries again
            keys = (self.dirty | set(self.tombstones)
                    | {(tid, p) for g, tid, p in self.owner.partitions if g == self.group})
        elif self.dirty:
            keys = self.dirty
        else:
            return None
        states: dict[tuple[uuid.UUID, int], ShareState | None] = {}
        for key in keys:
            state = self.owner.state_of((self.group, *key))
            if state is not None:
                states[key] = state
                self.tombstones.pop(key, None)   # initialized again since its deletion
            elif key in self.tombstones:
                states[key] = None               # DeleteShareGroupState
        self.dirty, self.rewrite = set(), False
        self.writes += 1
        for key, state in states.items():
            if state is None:
                self.tombstones[key] = self.writes
        try:
            pending = self.owner.store.write(self.group, states)
        except (OSError, StaleStateEpoch) as e:
            self._failed(e, now)
            return None
        if pending is None:          # durable already (the log was created or compacted)
            self.durable_end_offset = self.writes
            self.tombstones = {k: w for k, w in self.tombstones.items() if w > self.writes}
            self.owner.on_durable(self.group)
            return None
        return self.writes, pending

    def run_sync(self, token: tuple[int, Pending]) -> None:
        """On a GroupCommit thread."""
        ShareStateStore.sync(token[1])

    def end_sync(self, token: tuple[int, Pending], error: BaseException | None, now: int) -> None:
        n, pending = token
        if error is None:
            # a write made under the lease and fsynced is durable even if the group went since
            self.durable_end_offset = max(self.durable_end_offset, n)
            self.tombstones = {k: w for k, w in self.tombstones.items() if w > n}
            if not self.gone:
                ShareStateStore.synced(pending)
                self.owner.on_durable(self.group)
            return
        if self.gone:
            return   # deleted (its file with it), or another broker's now: nothing to cut back
        if isinstance(error, OSError):
            ShareStateStore.sync_failed(pending, error)
            self._failed(error, now)
        else:
            self._failed(OSError(f"fsync raised {error!r}"), now)

    def _failed(self, e: Exception, now: int) -> None:
        self.sync_generation += 1
        self.rewrite = True
        self.retry_at = now + RETRY_MS
        self.error = e
        log.error("share group %s: state write %d failed (%s); the requests it covered are answered with an "
                  "error, and the group's state is written whole by the next write", self.group, self.writes, e)


class ShareGroupCoordinator:
    def __init__(self, store: ShareStateStore, now_ms: Callable[[], int], config: ShareGroupConfig,
                 topics: Callable[[], TopicMetadata]) -> None:
        self.store = store
        self.now_ms = now_ms
        self.config = config
        self.topics = topics
        self.groups: dict[str, ShareGroup] = {}
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        self.partitions: dict[SpKey, SharePartition] = {}
        self._member_deadlines: dict[tuple[str, str], int] = {}
        # what every share-partition of this broker did, for metrics (and what was dropped with them)
        self.totals = Counts()
        # a group's configs (share.auto.offset.reset, share.isolation.level,
        # share.record.lock.duration.ms): set with IncrementalAlterConfigs on the GROUP resource
        self.group_configs: dict[str, dict[str, str]] = {}
        # the share-state group commit: one per group, fsyncs on threads of its own (not the
        # produce path's: its fsync count and wake-ups are the logs')
        self.commit = GroupCommit(now_ms, threads=SYNC_THREADS)
        self._syncs: dict[str, _GroupStateSync] = {}
        # KIP-1191 (`broker.groups.share_dlq`, which sets both): whether a group has a dead-letter
        # topic now (its REJECTed and limit-archived records go ARCHIVING with a dead letter), and
        # what to do when a group's state write is on disk (write the dead letters it carries)
        self.dead_letter: Callable[[str], bool] = lambda group: False
        self.on_durable: Callable[[str], None] = lambda group: None

    # ------------------------------------------------------------------ group configs
    def group_config(self, group: str, name: str) -> str:
        if group not in self.group_configs:
            self.group_configs[group] = self.store.read_configs(group)
        value = self.group_configs[group].get(name)
        return value if value is not None else self.group_config_default(name)

    def describe_group_configs(self, group: str) -> list[tuple[str, str, bool]]:
        """DescribeConfigs on a GROUP resource: (name, effective value, set on the group) for each
        config served. A group nobody configured is answered with the defaults, as Kafka answers,
        and is not remembered (any name may be asked for)."""
        configs = self.group_configs.get(group)
        if configs is None:
            configs = self.store.read_configs(group)
        return [(name, configs[name] if name in configs else self.group_config_default(name), name in configs)
                for name in GROUP_CONFIGS]

    def group_config_default(self, name: str) -> str:
        return {"share.auto.offset.reset": self.config.auto_offset_reset,
                "share.isolation.level": self.config.isolation_level,
                "share.record.lock.duration.ms": str(self.config.record_lock_duration_ms),
                DLQ_TOPIC_NAME: "", DLQ_COPY_RECORD: "false"}[name]

    def alter_group_configs(self, group: str, to_set: dict[str, str], to_delete: list[str],
                            validate_only: bool = False) -> None:
        """IncrementalAlterConfigs on a GROUP resource: validated first (INVALID_CONFIG), then
        kept durably beside the group's share state."""
        for name, value in to_set.items():
            check_group_config(name, value)
        for name in to_delete:
            if name not in GROUP_CONFIGS:
                raise KafkaProtocolError(E.INVALID_CONFIG, f"{name} is not a share group config")
        if validate_only:
            return
        configs = {k: v for k, v in {**self.group_configs.get(group, {}), **to_set}.items() if k not in to_delete}
        self.store.write_configs(group, configs)
        self.group_configs[group] = configs
        self.refresh_dead_letter(group)

    def refresh_dead_letter(self, group: str | None = None) -> None:
        """Whether the share-partitions of `group` (all: None) dead-letter what they archive, as
        the group's configs and the cluster's `share.version` say now."""
        flags: dict[str, bool] = {}
        for key, sp in self.partitions.items():
            if group is None or key[0] == group:
                if key[0] not in flags:
                    flags[key[0]] = self.dead_letter(key[0])
                sp.dead_letter = flags[key[0]]

    def lock_ms(self, group: str) -> int:
        return int(self.group_config(group, "share.record.lock.duration.ms"))

    # ------------------------------------------------------------------ membership
    def heartbeat(self, rq: ShareHeartbeat) -> ShareAnswer:
        validate(rq)
        group = self.groups.get(rq.group_id)
        if group is None:
            if rq.member_epoch != 0:
                raise KafkaProtocolError(E.UNKNOWN_MEMBER_ID, f"Group {rq.group_id} has no member {rq.member_id}.")
            group = self.groups[rq.group_id] = ShareGroup(rq.group_id)
        answer = heartbeat(group, rq, self.topics(), self.config.max_size)
        key = (rq.group_id, rq.member_id)
        if answer.left:
            # A member leaving keeps its share session and what it holds until it closes the
            # session (librdkafka's close sends the leave first and its last acknowledgements
            # after, with epoch -1) or until its locks run out; only a member whose session
            # timed out gives everything back at once.
            self._member_deadlines.pop(key, None)
        else:
            if rq.member_epoch == 0 and self._held(rq.group_id, rq.member_id):
                log.info("share group %s: member %s joined again holding %d records: they go back",
                         rq.group_id, rq.member_id, self._held(rq.group_id, rq.member_id))
                self._release_member(rq.group_id, rq.member_id)   # a rejoin: its old incarnation's records
            self._member_deadlines[key] = self.now_ms() + self.config.session_timeout_ms
        return answer

    def _member_gone(self, group: str, member: str) -> None:
        self._member_deadlines.pop((group, member), None)
        self.sessions.pop((group, member), None)
        self._release_member(group, member)

    def _release_member(self, group: str, member: str) -> None:
        for key, sp in self.partitions.items():
            if key[0] == group and sp.release_member(member):
                self.changed(key)
        self.flush(group)

    def _held(self, group: str, member: str) -> int:
        return sum(len(sp.acquired_by(member)) for key, sp in self.partitions.items() if key[0] == group)

    def expire(self) -> None:
        """The broker's tick: members whose session ran out leave; locks that ran out give
        their records back (persisted, so the delivery counts are kept)."""
        now = self.now_ms()
        for (group, member), deadline in list(self._member_deadlines.items()):
            if deadline <= now:
                g = self.groups.get(group)
                log.info("share group %s: member %s left (no heartbeat for %d ms)", group, member,
                         self.config.session_timeout_ms)
                if g is not None:
                    leave(g, member, self.topics())
                self._member_gone(group, member)
        for (group, member), s in list(self.sessions.items()):
            g = self.groups.get(group)
            if (g is None or member not in g.members) and now - s.last_used_ms > self.config.session_timeout_ms:
                self.close_session(group, member)   # a member gone without closing it
        self.refresh_dead_letter()
        for key, sp in self.partitions.items():
            if sp.expire(now):
                self.changed(key)
        for group in list(self._syncs):
            self.flush(group)   # what changed, and a failed write's rewrite once it is due

    def listing(self) -> list[tuple[str, str]]:
        """(group id, state) of every share group this broker knows (members or persisted state)."""
        known = {g: sg.state for g, sg in self.groups.items()}
        for g in self.store.groups():
            known.setdefault(g, "Empty")
        return sorted(known.items())

    def is_share_group(self, group: str) -> bool:
        return group in self.groups or self.store.has_group(group)

    def delete(self, group: str) -> int:
        """DeleteGroups of a share group: only an empty one; its state goes."""
        g = self.groups.get(group)
        if g is not None and g.members:
            return E.NON_EMPTY_GROUP
        self.groups.pop(group, None)
        self.sessions = {k: v for k, v in self.sessions.items() if k[0] != group}
        for key in [k for k in self.partitions if k[0] == group]:
            del self.partitions[key]
        self.group_configs.pop(group, None)
        sync = self._syncs.pop(group, None)
        if sync is not None:
            sync.gone = True
        self.store.delete(group)
        return E.NONE

    def unload(self, lost: Callable[[str], bool]) -> None:
        """This broker no longer coordinates the groups for which `lost` is true (it lost the lease
        of their `__consumer_offsets` partition, `broker.groups.ownership`): what it held of them
        in memory (members, share sessions, share-partitions, configs, their state log as last
        read) is dropped without a write, and writes still waited for are answered as not stored
        unless their fsync completed. A later owner, this broker included when a group comes back
        to it, starts from the files; before, a broker that got a group back served its old
        share-partitions from memory and wrote them over what the other owner had written."""
        groups = {g for g in (*self.groups, *self.group_configs, *self._syncs,
                              *(k[0] for k in self.partitions), *(k[0] for k in self.sessions)) if lost(g)}
        if not groups:
            return
        for key in [k for k in self.partitions if k[0] in groups]:
            for name, value in vars(self.partitions.pop(key).counts).items():
                setattr(self.totals, name, getattr(self.totals, name) + value)   # metrics only grow
        self.sessions = {k: v for k, v in self.sessions.items() if k[0] not in groups}
        self._member_deadlines = {k: v for k, v in self._member_deadlines.items() if k[0] not in groups}
        for group in groups:
            self.groups.pop(group, None)
            self.group_configs.pop(group, None)
            self.store.forget(group)
            sync = self._syncs.pop(group, None)
            if sync is not None:
                sync.gone = True
                sync.error = Fenced(f"share group {group}", -1, -1)
            log.info("share group %s: no longer coordinated here; its state in memory is dropped", group)
        self.commit.settle_all()

    # ------------------------------------------------------------------ share sessions
    def session(self, group: str, member: str, epoch: int) -> ShareSession | None:
        """The member's session for a request at `epoch` (0 opens one, -1 closes it: None);
        raises KafkaProtocolError with the session error."""
        key = (group, member)
        current = self.sessions.get(key)
        if epoch == 0:
            if current is None and len(self.sessions) >= self.config.max_share_sessions \
                    and not (self._is_member(group, member) and self._evict_stray_session()):
                raise KafkaProtocolError(E.SHARE_SESSION_LIMIT_REACHED,
                                         f"the broker has {len(self.sessions)} share sessions "
                                         f"(group.share.max.share.sessions)")
            if current is not None:   # the client lost its session's state: what it held goes back
                log.info("share group %s: member %s opened a new share session over epoch %d; %d records "
                         "it held go back", group, member, current.epoch, self._held(group, member))
                self._release_member(group, member)
            s = self.sessions[key] = ShareSession(1, last_used_ms=self.now_ms())
            return s
        if current is None:
            raise KafkaProtocolError(E.SHARE_SESSION_NOT_FOUND, f"no share session for member {member}")
        current.last_used_ms = self.now_ms()
        if epoch == -1:
            return None
        if epoch != current.epoch:
            raise KafkaProtocolError(E.INVALID_SHARE_SESSION_EPOCH,
                                     f"share session epoch {epoch}, expected {current.epoch}")
        current.epoch = current.epoch + 1 if current.epoch < 2**31 - 1 else 1
        return current

    def _is_member(self, group: str, member: str) -> bool:
        g = self.groups.get(group)
        return g is not None and member in g.members

    def _evict_stray_session(self) -> bool:
        """The bound is reached and a member of its group opens a session: the least recently used
        session whose member id is no member of its group (a member gone, a client not yet joined
        again after a restart, or an id made up) is closed to make room, as its records go back.
        Else ids that never joined, which nothing times out before the session timeout, would fill
        the broker's bound for every group together and lock every other group's members out."""
        stray = [(s.last_used_ms, key) for key, s in self.sessions.items() if not self._is_member(*key)]
        if not stray:
            return False
        _used, (group, member) = min(stray)
        log.info("share group %s: share session of %s (no member of the group) closed to make room "
                 "(group.share.max.share.sessions)", group, member)
        self.close_session(group, member)
        return True

    def close_session(self, group: str, member: str) -> None:
        """ShareFetch/ShareAcknowledge with epoch -1, after its acknowledgements: what the member
        still holds goes back."""
        self.sessions.pop((group, member), None)
        self._release_member(group, member)

    def forget(self, group: str, member: str, session: ShareSession, parts: set[tuple[uuid.UUID, int]]) -> None:
        session.partitions -= parts
        for topic_id, p in parts:
            key = (group, topic_id, p)
            sp = self.partitions.get(key)
            if sp is not None and sp.release_member(member):
                self.changed(key)
        self.flush(group)

    # ------------------------------------------------------------------ share-partitions
    def share_partition(self, group: str, topic_id: uuid.UUID, partition: int, log_start: int, log_end: int
                        ) -> SharePartition:
        """Loaded from the store, or initialized at share.auto.offset.reset; the log's start
        moving past it (retention) moves it too."""
        key = (group, topic_id, partition)
        sp = self.partitions.get(key)
        if sp is None:
            c = self.config
            stored = self.store.read(group, topic_id, partition)
            state = stored if not self._deleted(key) else None
            if state is None:   # InitializeShareGroupState: written with the request's other changes
                start = log_start if self.group_config(group, "share.auto.offset.reset") == "earliest" else log_end
                # (above a deleted state's epoch while the store may still hold it)
                state = ShareState(stored.state_epoch + 1 if stored is not None else 0, start, ())
                self.changed(key)
            dead_letter = self.dead_letter(group)
            sp = SharePartition.loaded(state.start_offset, state.batches, c.delivery_count_limit,
                                       c.partition_max_record_locks, state.state_epoch, state.dead_letters,
                                       dead_letter)
            self.partitions[key] = sp
            if dead_letter and len(sp.dead_letters()) != len(state.dead_letters.pending if state.dead_letters else ()):
                self.changed(key)   # archived by the limit as it loaded: its new dead letters are written
        else:
            sp.dead_letter = self.dead_letter(group)
        if log_start > sp.start:
            sp.move_start(log_start)
            self.changed(key)
        if log_end < sp.end:   # the log was truncated below what was fetched (a lost unflushed tail)
            sp.reset_to(min(sp.start, log_end))
            self.changed(key)
        return sp

    # ------------------------------------------------------------------ offsets (APIs 90-92)
    def summary(self, group: str, topic_id: uuid.UUID, partition: int) -> ShareState | None:
        """ReadShareGroupStateSummary: the share-partition's state, from memory where it is loaded
        here, else as stored; None: it has none. The store is asked only for a share group: a
        lookup of any other id would keep a log object per id a client names."""
        key = (group, topic_id, partition)
        state = self.state_of(key)
        if state is None and self.store.has_group(group) and not self._deleted(key):
            state = self.store.read(group, topic_id, partition)
        return state

    def initialized(self, group: str) -> set[tuple[uuid.UUID, int]]:
        """The share-partitions of `group` that have a state (Kafka's initialized ones)."""
        out = {(tid, p) for g, tid, p in self.partitions if g == group}
        out.update(k for k in self.store.partitions(group) if not self._deleted((group, *k)))
        return out

    def is_empty(self, group: str) -> bool:
        g = self.groups.get(group)
        return g is None or not g.members

    def reset(self, group: str, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        """AlterShareGroupOffsets (the group has no members): the share-partition starts again at
        `offset` with nothing in flight, at a state epoch above the one it had; what a member
        that left still held of it is gone with it; the dead letters it owes (KIP-1191) are kept.
        The number of the group's write that carries it (`durable`)."""
        key = (group, topic_id, partition)
        old = self._drop_loaded(key)
        stored = self.store.read(group, topic_id, partition) if old is None else None
        epoch = old.state_epoch if old is not None else stored.state_epoch if stored is not None else -1
        c = self.config
        # dead letters owed (KIP-1191) are owed still: rejected records stay rejected
        owed = old.dead_letter_state() if old is not None else stored.dead_letters if stored is not None else None
        self.partitions[key] = SharePartition.loaded(offset, (), c.delivery_count_limit, c.partition_max_record_locks,
                                                     epoch + 1, owed, self.dead_letter(group))
        return self.changed(key)

    def drop(self, group: str, topic_id: uuid.UUID, partition: int) -> int:
        """DeleteShareGroupOffsets: the share-partition's state goes (DeleteShareGroupState: a
        tombstone in the group's next write, and in every rewrite until one succeeds), so its next
        ShareFetch initializes it at `share.auto.offset.reset`. The write's number, as `reset`."""
        key = (group, topic_id, partition)
        self._drop_loaded(key)
        sync = self._sync(group)
        sync.tombstones[(topic_id, partition)] = sync.writes + 1
        sync.dirty.add((topic_id, partition))
        return sync.next_write()

    def _deleted(self, key: SpKey) -> bool:
        """Whether the share-partition's state was deleted and its tombstone is not yet known to
        be on disk: what the store still holds of it is not read (a ShareFetch meanwhile would
        load the deleted state, and the group's next write would write it back)."""
        sync = self._syncs.get(key[0])
        return sync is not None and (key[1], key[2]) in sync.tombstones

    def _drop_loaded(self, key: SpKey) -> SharePartition | None:
        sp = self.partitions.pop(key, None)
        if sp is not None:
            for name, value in vars(sp.counts).items():
                setattr(self.totals, name, getattr(self.totals, name) + value)   # metrics only grow
        return sp

    # ------------------------------------------------------------------ durability (group commit)
    def changed(self, key: SpKey) -> int:
        """The share-partition's state changed: it goes into the group's next write, whose number
        this returns (for `durable`)."""
        sync = self._sync(key[0])
        sync.dirty.add((key[1], key[2]))
        return sync.next_write()

    def flush(self, group: str) -> None:
        """Have the group's changes written now if no write of it is in flight (else the next one
        takes them when it ends); nobody waits here."""
        sync = self._syncs.get(group)
        if sync is None or sync.next_write() <= sync.durable_end_offset:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return   # no event loop (a test of the coordinator alone): the next request writes it
        self.commit.appended(sync)

    async def durable(self, group: str, n: int) -> Exception | None:
        """Wait until the group's write `n` (from `changed`) or a later one is on disk: None, or
        the error of the write that failed (the request answers it)."""
        sync = self._syncs.get(group)
        if sync is None:
            return OSError(f"share group {group} was deleted, or is coordinated by another broker now")
        waiting = self.commit.durable(sync, n)
        if waiting is None or await waiting:
            return None
        return sync.error or OSError(f"share group {group}: the state write was not completed")

    def covering_write(self, group: str) -> int:
        """The group's write that covers every change made so far (0: none), for `durable`."""
        sync = self._syncs.get(group)
        return 0 if sync is None else sync.next_write()

    def was_durable(self, group: str, n: int) -> bool:
        """Whether the group's write `n` is known to be on disk (no waiting)."""
        sync = self._syncs.get(group)
        return sync is not None and sync.durable_end_offset >= n

    def state_of(self, key: SpKey) -> ShareState | None:
        """What the store keeps of a share-partition (None: not loaded here)."""
        sp = self.partitions.get(key)
        if sp is None:
            return None
        return ShareState(sp.state_epoch, sp.start, tuple(sp.state_batches()), sp.dead_letter_state())

    def _sync(self, group: str) -> _GroupStateSync:
        sync = self._syncs.get(group)
        if sync is None:
            sync = self._syncs[group] = _GroupStateSync(self, group)
        return sync

    def close(self) -> None:
        """The broker stops: the writes in flight end, then what changed since is written and
        fsynced here (a clean stop loses nothing; a crash loses only what nobody was told)."""
        self.commit.close()
        for group, sync in self._syncs.items():
            token = sync.begin_sync(1 << 62)
            if token is None:
                continue
            try:
                sync.run_sync(token)
                sync.end_sync(token, None, self.now_ms())
            except OSError as e:
                log.error("share group %s: its last state write at the stop failed: %s", group, e)

    def counts(self) -> Counts:
        out = Counts(**vars(self.totals))
        for sp in self.partitions.values():
            for name, value in vars(sp.counts).items():
                setattr(out, name, getattr(out, name) + value)
        return out


def share_group_config(c: Any) -> ShareGroupConfig:
    """From the broker's settings (`broker.config`)."""
    return ShareGroupConfig(c["group.share.heartbeat.interval.ms"], c["group.share.session.timeout.ms"],
                            c["group.share.record.lock.duration.ms"], c["group.share.delivery.count.limit"],
                            c["group.share.partition.max.record.locks"], c["group.share.max.size"],
                            c["group.share.max.share.sessions"])
