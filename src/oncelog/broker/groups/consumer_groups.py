"""KIP-848 consumer groups on the broker (Kafka 4's group coordinator for groups of type
`consumer`): heartbeats decided by `core.groups.heartbeat`, the records of what each one changed
appended to the group's record log (`storage.group_records`, fsynced) before the member is
answered, and the timers Kafka keeps per member. A heartbeat's work is in proportion to what it
changes, not to the size of its group (issue 36: every join went over every member and rewrote
the whole group): the group keeps its indexes with each change and journals it, so that what
changed is written and a refused or unstorable change is undone without copying the group.

- Session: a member that sends no heartbeat for `group.consumer.session.timeout.ms` is fenced
  (removed; the group epoch moves and its partitions go to the others). A static member that
  left with epoch -2 keeps its place and partitions until then.
- Rebalance: a member asked to revoke partitions that has not done so within its rebalance
  timeout (the client's `max.poll.interval.ms`) is fenced.
Timers are not stored: a broker that loads a group (a start, or becoming its coordinator) gives
every member a fresh session from that moment and every member that still has partitions to
revoke a fresh rebalance timeout, so members that keep heartbeating with the epoch they had see no
change (Kafka's GroupMetadataManager.onLoaded).

A group id names one group of one type: a heartbeat that would create a consumer group where an
empty classic group exists converts it (its committed offsets stay); a classic group with members
is not converted (GROUP_ID_NOT_FOUND, what Kafka answers with `group.consumer.migration.policy`
disabled). A classic JoinGroup converts an empty consumer group back the same way.
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from oncelog.broker.groups.record_sync import RecordSync
from oncelog.core.groups.consumer_group import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    Member,
    OwnershipError,
    TopicMetadata,
)
from oncelog.core.groups.heartbeat import (
    Answer,
    Heartbeat,
    Settings,
    complete_rejoin,
    fence,
    heartbeat,
    leave,
    validate,
)
from oncelog.core.groups.reconciliation import MemberState
from oncelog.core.groups.subscriptions import forget, resolve
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.group_offsets import GroupOffsetStore
from oncelog.storage.topic_registry import TopicInfo

log = logging.getLogger(__name__)
E = ErrorCode


class TopicFilter(Protocol):
    """A member's DESCRIBE rights on topics (`broker.security.authorization.TopicVisibility`)."""

    @property
    def key(self) -> Hashable: ...

    def __call__(self, names: Iterable[str]) -> frozenset[str]: ...


@dataclass(frozen=True)
class ConsumerGroupConfig:
    enabled: bool = True                     # `consumer` in group.coordinator.rebalance.protocols
    heartbeat_interval_ms: int = 5000        # group.consumer.heartbeat.interval.ms
    session_timeout_ms: int = 45000          # group.consumer.session.timeout.ms
    settings: Settings = Settings()          # group.consumer.assignors, group.consumer.max.size


@dataclass(frozen=True)
class Outcome:
    error: int
    message: str | None = None
    answer: Answer | None = None


class ConsumerGroupCoordinator:
    def __init__(self, store: GroupOffsetStore, now_ms: Callable[[], int], config: ConsumerGroupConfig,
                 topics: Callable[[], TopicMetadata], owns: Callable[[str], bool],
                 release_classic: Callable[[str], bool], sync: RecordSync | None = None) -> None:
        """`topics`: the cluster's topics a subscription may name (internal ones left out);
        `release_classic(group id)`: True if no classic group of that id is in use (an empty one
        is forgotten), so a consumer group may take the id."""
        self.store = store
        self.now_ms = now_ms
        self.config = config
        self.topics = topics
        self.owns = owns
        self.release_classic = release_classic
        self.groups: dict[str, ConsumerGroup] = {}
        self.sessions: dict[tuple[str, str], int] = {}              # (group, member) -> deadline
        self.rebalances: dict[tuple[str, str], tuple[int, int]] = {}  # (group, member) -> (epoch, deadline)
        self._image: TopicMetadata = {}
        self._image_version = 0
        self._regexes: dict[str, tuple[int, frozenset[str]]] = {}   # regex -> (image version, matches)
        # (group, member) -> what the member may DESCRIBE, from its last heartbeat taken
        self.visibility: dict[tuple[str, str], TopicFilter] = {}
        self.sync = sync or RecordSync(now_ms)   # the group commit of the records' fsyncs

    # ------------------------------------------------------------------ heartbeats
    async def heartbeat_durably(self, rq: Heartbeat, version: int, visible: TopicFilter | None = None) -> Outcome:
        """`heartbeat`, its records written on the event loop (page cache: microseconds) and
        answered once an fsync off the loop covered them and everything written to the group
        before (Kafka answers a group operation when the records it depends on are committed):
        one fsync for all the heartbeats that came meanwhile, and other clients' requests are
        served while it runs."""
        outcome = self.heartbeat(rq, version, visible, sync=False)
        if outcome.error and outcome.error != E.NOT_COORDINATOR:
            # refused: nothing of it was written, but what it was answered from must be on disk
            return outcome if await self.flushed(rq.group_id) else Outcome(E.NOT_COORDINATOR)
        if outcome.error:
            return outcome
        if not await self.flushed(rq.group_id):
            return Outcome(E.NOT_COORDINATOR, "the group's change could not be stored")
        return outcome

    async def flushed(self, group_id: str) -> bool:
        """True once everything written to the group's record log so far is on disk (the group
        commit, `record_sync`); False if its fsync failed (the group is unloaded: read again from
        what is on disk)."""
        records = self.store.consumer_log(group_id)
        if await self.sync.flushed(records):
            return True
        if records is not None and records.failed is not None and self.store.consumer_log(group_id) is records:
            log.error("group %s: its records could not be made durable (%s); the group is read again", group_id,
                      records.failed)
            if group_id in self.groups:
                self._unload(group_id)
        return False

    def heartbeat(self, rq: Heartbeat, version: int, visible: TopicFilter | None = None,
                  sync: bool = True) -> Outcome:
        """`visible`: the caller's DESCRIBE rights on topics (None: every topic); its regex matches
        are filtered by them, now and at every later resolution while it is a member. `sync=False`:
        the records are written, not fsynced (`heartbeat_durably` waits for that)."""
        settings = self.config.settings
        g = self.group(rq.group_id)
        rq = complete_rejoin(rq, g)
        try:
            validate(rq, version, settings)
        except KafkaProtocolError as e:
            return Outcome(e.code, e.message)
        if g is None:
            if rq.member_epoch != 0:
                return Outcome(E.GROUP_ID_NOT_FOUND, f"Consumer group {rq.group_id} not found.")
            if not self.release_classic(rq.group_id):
                return Outcome(E.GROUP_ID_NOT_FOUND, f"Group {rq.group_id} is not a consumer group.")
            g = ConsumerGroup(rq.group_id)
            new = True
        else:
            new = False
        g.mark()
        topics = self._topics()
        try:
            matches = self._matcher(g, rq.member_id, visible)
            if rq.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                answer = leave(g, rq, topics, matches)
            else:
                answer = heartbeat(g, rq, topics, settings, matches)
        except KafkaProtocolError as e:
            self._put_back(g, new)
            return Outcome(e.code, e.message)
        except OwnershipError:
            self._put_back(g, new)
            log.exception("group %s: heartbeat of member %s refused", rq.group_id, rq.member_id)
            return Outcome(E.UNKNOWN_SERVER_ERROR, "the coordinator refused a change that would give a partition "
                                                   "to two members")
        touched = g.touched_members()
        if not self._store(g, new, sync):
            return Outcome(E.NOT_COORDINATOR, "the group's change could not be stored")
        self._drop_unused_regexes(_regexes_of(touched.values()))
        self._after(g, rq, answer, touched, visible)
        return Outcome(E.NONE, None, answer)

    def _after(self, g: ConsumerGroup, rq: Heartbeat, answer: Answer, touched: Mapping[str, Member | None],
               visible: TopicFilter | None) -> None:
        """Timers (and the member's rights) after a heartbeat that was taken. `touched`: the
        members it changed, as they were before."""
        key = (g.group_id, answer.member_id)
        for gone in [mid for mid in touched if mid not in g.members]:
            self._forget_timers(g.group_id, gone)
        m = answer.member
        if m is not None and visible is not None:
            self.visibility[key] = visible
        if m is None:
            if rq.member_epoch == LEAVE_EPOCH:
                log.info("group %s: member %s left (epoch %d)", g.group_id, rq.member_id, g.group_epoch)
            else:
                log.info("group %s: static member %s (instance %s) left for now", g.group_id, rq.member_id,
                         rq.instance_id)
            return
        self.sessions[key] = self.now_ms() + self.config.session_timeout_ms
        old = touched[m.member_id] if m.member_id in touched else m
        if m.state == MemberState.UNREVOKED_PARTITIONS:
            if key not in self.rebalances or self.rebalances[key][0] != m.member_epoch:
                self.rebalances[key] = (m.member_epoch, self.now_ms() + max(m.rebalance_timeout_ms, 0))
        else:
            self.rebalances.pop(key, None)
        if old is None or old.member_epoch != m.member_epoch or old.assigned != m.assigned:
            log.debug("group %s: member %s at epoch %d (group epoch %d, %s) owns %d partitions", g.group_id,
                      m.member_id, m.member_epoch, g.group_epoch, m.state.name,
                      sum(len(p) for p in m.assigned.values()))

    def _topics(self) -> TopicMetadata:
        image = self.topics()
        if image != self._image:
            self._image, self._image_version = dict(image), self._image_version + 1
        return self._image

    def _matcher(self, g: ConsumerGroup, member_id: str | None,
                 visible: TopicFilter | None) -> Callable[[str], frozenset[str]]:
        """`matches` for the group's resolutions: what a regex matches that every member using it
        may DESCRIBE (`visible` stands for `member_id`'s rights, the heartbeat being served).
        A member whose rights are not known here (the group was loaded and it has not heartbeat
        since) keeps the regex within what it resolved to when stored, which was filtered then.
        Without an authorizer every filter lets every name through."""
        def matches(regex: str) -> frozenset[str]:
            found = self._matches(regex)
            filters: dict[Hashable, TopicFilter] = {}
            unknown = False
            for mid in g.regex_users(regex):
                f = visible if mid == member_id and visible is not None else self.visibility.get((g.group_id, mid))
                if f is None:
                    unknown = True
                else:
                    filters.setdefault(f.key, f)
            if unknown:
                found = found & g.regex_topics.get(regex, frozenset())
            for f in filters.values():
                found = f(found)
            return frozenset(found)
        return matches

    def _matches(self, regex: str) -> frozenset[str]:
        """The topics a regex matches, computed again only when the topics changed."""
        cached = self._regexes.get(regex)
        if cached is None or cached[0] != self._image_version:
            if len(self._regexes) > 10_000:
                self._regexes.clear()
            cached = self._regexes[regex] = (self._image_version, resolve(regex, self._image))
        return cached[1]

    # ------------------------------------------------------------------ storage
    def _store(self, g: ConsumerGroup, new: bool, sync: bool = True) -> bool:
        """Store what changed in the group since its `mark`, and only that (Kafka writes the
        records of what changed: a heartbeat of a member of a group of thousands writes what one
        member's does); on failure put back what it was (the member is told NOT_COORDINATOR,
        finds the coordinator again and retries)."""
        changes = g.changes()
        if not new and not changes:
            return True
        if not self.owns(g.group_id):
            log.info("group %s: change not stored: another broker coordinates the group now", g.group_id)
            self._put_back(g, new)
            return False
        try:
            self.store.append_consumer(g.group_id, changes, g.record, new, sync)
        except OSError as e:
            log.error("group %s: storing the consumer group failed: %s", g.group_id, e)
            self._put_back(g, new)
            return False
        self.groups[g.group_id] = g
        return True

    def _put_back(self, g: ConsumerGroup, new: bool) -> None:
        # the regexes the change brought: unused again once it is undone
        brought = _regexes_of(g.members.get(mid) for mid in g.touched_members())
        g.rollback()
        if new:
            self.groups.pop(g.group_id, None)
        self._drop_unused_regexes(brought)

    def _drop_unused_regexes(self, candidates: Iterable[str]) -> None:
        """Regexes no member of a group coordinated here uses any more: their matches and
        compiled form go (Kafka keeps a regex only while a member subscribes with it; a member
        that left, was fenced or changed its regex no longer holds memory)."""
        unused = set(candidates)
        for g in self.groups.values():
            if not unused:
                return
            unused -= g.regexes()
        for regex in unused:
            self._regexes.pop(regex, None)
            forget(regex)
        if sum(len(r) for r in unused) >= _TRIM_AFTER_CHARS:
            _return_memory()


    # ------------------------------------------------------------------ loading
    def group(self, group_id: str) -> ConsumerGroup | None:
        g = self.groups.get(group_id)
        if g is None and self.owns(group_id):
            record = self.store.consumer(group_id)
            if record is not None:
                g = self.groups[group_id] = ConsumerGroup.restore(group_id, record)
                now = self.now_ms()
                for m in g.members.values():
                    key = (group_id, m.member_id)
                    self.sessions[key] = now + self.config.session_timeout_ms
                    if m.state == MemberState.UNREVOKED_PARTITIONS:
                        self.rebalances[key] = (m.member_epoch, now + max(m.rebalance_timeout_ms, 0))
                log.info("group %s: loaded at group epoch %d (assignment epoch %d) with %d members, %s", group_id,
                         g.group_epoch, g.assignment_epoch, len(g.members), g.state)
        return g

    def reconcile(self) -> None:
        """Load the stored consumer groups this broker coordinates, forget those it no longer does."""
        for group_id in [gid for gid in self.groups if not self.owns(gid)]:
            self._unload(group_id)
        for group_id in self.store.groups():
            if group_id not in self.groups and self.owns(group_id):
                self.group(group_id)

    def unload_partition(self, partition: int) -> None:
        """The groups of a `__consumer_offsets` partition this broker lost are forgotten."""
        for group_id in [gid for gid in self.groups if self.store.partition_of(gid) == partition]:
            self._unload(group_id)

    def _unload(self, group_id: str) -> None:
        g = self.groups.pop(group_id)
        self.store.close_consumer(group_id)
        for member_id in g.members:
            self._forget_timers(group_id, member_id)
        self._drop_unused_regexes(g.regexes())
        log.info("group %s: no longer coordinated here", group_id)

    def _forget_timers(self, group_id: str, member_id: str) -> None:
        self.sessions.pop((group_id, member_id), None)
        self.rebalances.pop((group_id, member_id), None)
        self.visibility.pop((group_id, member_id), None)

    def is_consumer_group(self, group_id: str) -> bool:
        return self.group(group_id) is not None

    def release(self, group_id: str) -> bool:
        """A classic JoinGroup would create a group of this id: True if no consumer group holds
        it (an empty one is converted: its records go, its offsets stay)."""
        g = self.group(group_id)
        if g is None:
            return True
        if g.members:
            return False
        try:
            self.store.drop_consumer(group_id)
        except OSError as e:
            log.error("group %s: converting the empty consumer group failed: %s", group_id, e)
            return False
        del self.groups[group_id]
        log.info("group %s: the empty consumer group becomes a classic group", group_id)
        return True

    def forget(self, group_id: str) -> None:
        """The group was deleted (DeleteGroups, or emptied of offsets by expiry)."""
        g = self.groups.pop(group_id, None)
        if g is not None:
            for member_id in g.members:
                self._forget_timers(group_id, member_id)
            self._drop_unused_regexes(g.regexes())

    # ------------------------------------------------------------------ offsets
    def validate_commit(self, g: ConsumerGroup, member_id: str, epoch: int, api_version: int | None,
                        partitions: Iterable[tuple[str, int]]) -> int:
        """Kafka's ConsumerGroup.validateOffsetCommit: -1 from outside the group only while it is
        empty; a member of this protocol commits with OffsetCommit v9+; its epoch must be its
        current one, or (Kafka 4.3, KIP-1251) an older one at which it already owned each
        partition committed: else STALE_MEMBER_EPOCH, which a transactional commit (`api_version`
        None) answers as ILLEGAL_GENERATION. Kafka 4.0 wants the current epoch alone, so a commit
        racing the heartbeat that moves the epoch fails there; librdkafka reports that to the
        application instead of retrying."""
        transactional = api_version is None
        if epoch < 0 and not g.members:
            return E.NONE
        m = g.members.get(member_id)
        if m is None:
            return E.UNKNOWN_MEMBER_ID
        if api_version is not None and api_version < 9:
            return E.UNSUPPORTED_VERSION
        ids = self._topics()
        if not m.commit_epoch_valid(epoch, ((ids[t][0] if t in ids else None, p) for t, p in partitions)):
            return E.ILLEGAL_GENERATION if transactional else E.STALE_MEMBER_EPOCH
        return E.NONE

    def validate_fetch(self, group_id: str, member_id: str | None, epoch: int) -> int:
        """OffsetFetch v9's member checks (Kafka's ConsumerGroup.validateOffsetFetch)."""
        g = self.group(group_id)
        if g is None or (member_id is None and epoch < 0):
            return E.NONE
        m = g.members.get(member_id or "")
        if m is None:
            return E.UNKNOWN_MEMBER_ID
        return E.STALE_MEMBER_EPOCH if epoch != m.member_epoch else E.NONE

    def subscribed(self, group_id: str) -> frozenset[str]:
        g = self.group(group_id)
        return frozenset() if g is None else g.subscribed_names()

    # ------------------------------------------------------------------ timers (the broker's tick)
    def expire(self) -> None:
        for group_id, member_id in self._due():
            self._expire_member(group_id, member_id)

    async def expire_stepwise(self) -> None:
        """`expire`, for the broker's tick: one member at a time, other requests served between
        two, their records fsynced off the loop once per group at the end (1,200 abandoned members
        fenced in one go, each with a whole-group write, stalled the broker 0.6-1.4 s, issue 36)."""
        written: set[str] = set()
        for group_id, member_id in self._due():
            if self._expire_member(group_id, member_id, sync=False):
                written.add(group_id)
            await asyncio.sleep(0)
        for group_id in sorted(written):
            await self.flushed(group_id)

    def _due(self) -> list[tuple[str, str]]:
        now = self.now_ms()
        due = {key for key, deadline in self.sessions.items() if now > deadline}
        due |= {key for key, (epoch, deadline) in self.rebalances.items()
                if now > deadline and self._epoch_of(*key) == epoch}
        return sorted(due)

    def _epoch_of(self, group_id: str, member_id: str) -> int | None:
        g = self.groups.get(group_id)
        m = g.members.get(member_id) if g is not None else None
        return None if m is None else m.member_epoch

    def _expire_member(self, group_id: str, member_id: str, sync: bool = True) -> bool:
        """Fence the member if it is still due; True if records were written."""
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            self._forget_timers(group_id, member_id)
            return False
        now = self.now_ms()
        session = self.sessions.get((group_id, member_id), 0) < now
        rebalance = self.rebalances.get((group_id, member_id))
        if not session and not (rebalance is not None and now > rebalance[1]
                                and g.members[member_id].member_epoch == rebalance[0]):
            return False   # it heartbeat while earlier members were being fenced
        g.mark()
        fence(g, member_id, self._topics(), self._matcher(g, None, None))
        touched = g.touched_members()
        if not self._store(g, False, sync):
            return False  # tried again at the next tick
        self._drop_unused_regexes(_regexes_of(touched.values()))
        self._forget_timers(group_id, member_id)
        log.info("group %s: member %s fenced: %s (group epoch %d)", group_id, member_id,
                 f"no heartbeat within the session timeout ({self.config.session_timeout_ms} ms)" if session
                 else "it did not revoke its partitions within its rebalance timeout", g.group_epoch)
        return True

    def listing(self) -> list[tuple[str, str]]:
        """(group id, state) of every consumer group this broker coordinates."""
        self.reconcile()
        return sorted((gid, g.state) for gid, g in self.groups.items())


def _regexes_of(members: Iterable[Member | None]) -> set[str]:
    return {m.subscribed_topic_regex for m in members if m is not None and m.subscribed_topic_regex}


def consumer_group_config(c: Any) -> ConsumerGroupConfig:
    """From the broker's settings (`broker.config`)."""
    return ConsumerGroupConfig(
        "consumer" in {p.strip().lower() for p in c["group.coordinator.rebalance.protocols"].split(",")},
        c["group.consumer.heartbeat.interval.ms"], c["group.consumer.session.timeout.ms"],
        Settings(tuple(a.strip() for a in c["group.consumer.assignors"].split(",") if a.strip()),
                 c["group.consumer.max.size"], c["message.max.bytes"]))


def topic_metadata(topics: Mapping[str, TopicInfo], internal: Callable[[str], bool]) -> TopicMetadata:
    """name -> (topic id, partitions) of the topics a subscription may name."""
    return {name: (info.topic_id, info.partitions) for name, info in topics.items() if not internal(name)}


# glibc keeps freed heap memory for reuse; after a large regex (up to a member record's size,
# about 1 MB, compiled to a few times that) goes, hand it back so the broker's RSS goes back down
_TRIM_AFTER_CHARS = 64 << 10


def _return_memory() -> None:
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass   # not glibc: nothing to do
