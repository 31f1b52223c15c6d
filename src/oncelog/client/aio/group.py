"""A consumer's group membership over the wire: a connection of its own to the group's
coordinator (a classic JoinGroup waits for the whole rebalance, which must not hold up fetches),
a background task that heartbeats, and the rebalance events the consumer's poll hands to the
application's callbacks (`on_assign`, `on_revoke`, `on_lost`, confluent-kafka's names).

Protocols (`group.protocol`, confluent-kafka's setting): `consumer` is KIP-848 (the coordinator
assigns; `client.group_membership` decides what to send and what to give up or take), `classic`
is JoinGroup/SyncGroup with the `range` assignor computed by the group's leader (eager: every
partition is revoked before each rejoin). Unset, the member uses `consumer` where the coordinator
serves it (ConsumerGroupHeartbeat advertised and not answered UNSUPPORTED_VERSION), else `classic`.

Partitions change hands only through events the application sees at its next poll:
- revoke: with `enable.auto.commit`, what the application has consumed of them is committed
  first; then `on_revoke` runs (it may commit too: the partitions are still assigned); only after
  it returns are they removed and the coordinator told (KIP-848: the next heartbeat reports them
  gone, and only then are they given to another member);
- assign: the partitions are added at their committed offsets (else `auto.offset.reset`), then
  `on_assign` runs (it may seek);
- lost (the coordinator fenced the member): they are dropped at once, nothing can be committed for
  them; `on_lost` runs, or `on_revoke` when there is none (as confluent-kafka does).
An application that stops polling stops acknowledging revocations, and the coordinator removes it
after its rebalance timeout (`max.poll.interval.ms`), as Kafka does.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oncelog.client.aio import wire
from oncelog.client.aio.admin_base import AdminError
from oncelog.client.aio.admin_groups import RETRY_COORDINATOR, find_coordinator
from oncelog.client.aio.connection import BrokerConnectionError, Connection
from oncelog.client.errors import KafkaClientError
from oncelog.client.group_membership import ConsumerProtocolMember, GroupError, range_assignment
from oncelog.client.types import ConsumerGroupMetadata, TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.consumer_protocol import decode_assignment, encode_assignment, encode_subscription
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import ErrorCode, error_code

if TYPE_CHECKING:
    from oncelog.client.aio.consumer import AIOConsumer

log = logging.getLogger("oncelog.client.group")
E = ErrorCode
_COORDINATOR_MOVED = {E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS}
RANGE = "range"


class CommitFailedError(KafkaClientError):
    """An offset commit the coordinator refused; `code` is Kafka's error."""

    def __init__(self, code: int, what: str) -> None:
        self.code = error_code(code)
        super().__init__(f"{what}: {self.code.name}")


@dataclass
class RebalanceEvent:
    kind: str                                  # "assign", "revoke" or "lost"
    partitions: list[TopicPartition]
    done: asyncio.Future = field(repr=False)


@dataclass(frozen=True)
class GroupConfig:
    group_id: str
    protocol: str | None          # group.protocol: "consumer", "classic", or None (consumer where served)
    instance_id: str | None       # group.instance.id
    assignor: str | None          # group.remote.assignor (KIP-848)
    session_timeout_ms: int       # session.timeout.ms (classic)
    heartbeat_interval_ms: int    # heartbeat.interval.ms (classic)
    max_poll_interval_ms: int     # max.poll.interval.ms: the rebalance timeout
    auto_commit: bool             # enable.auto.commit
    auto_commit_interval_ms: int  # auto.commit.interval.ms

    @classmethod
    def from_dict(cls, c: dict) -> GroupConfig:
        protocol = c.get("group.protocol")
        if protocol is not None and str(protocol).lower() not in ("consumer", "classic"):
            raise KafkaClientError(f"group.protocol must be consumer or classic, got {protocol!r}")
        if protocol is not None and str(protocol).lower() == "consumer":
            bad = [k for k in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")
                   if k in c]
            if bad:  # as librdkafka and the Java client: the coordinator decides these
                raise KafkaClientError(f"{', '.join(bad)} cannot be set with group.protocol=consumer")
        strategy = str(c.get("partition.assignment.strategy", RANGE))
        if RANGE not in [s.strip() for s in strategy.split(",")]:
            raise KafkaClientError(f"partition.assignment.strategy: oncelog's consumer assigns with {RANGE}")
        return cls(str(c["group.id"]), str(protocol).lower() if protocol is not None else None,
                   c.get("group.instance.id"), c.get("group.remote.assignor"),
                   int(c.get("session.timeout.ms", 45000)), int(c.get("heartbeat.interval.ms", 3000)),
                   int(c.get("max.poll.interval.ms", 300000)),
                   str(c.get("enable.auto.commit", "true")).lower() == "true",
                   int(c.get("auto.commit.interval.ms", 5000)))


class AIOGroup:
    def __init__(self, consumer: AIOConsumer, config: GroupConfig) -> None:
        self.consumer = consumer
        self.cluster = consumer.cluster
        self.config = config
        self.topics: list[str] = []
        self.patterns: list[str] = []
        self.protocol: str | None = None      # the one in use, once decided
        self.member_id = ""
        self.generation = -1                  # the classic generation, or the KIP-848 member epoch
        self.events: deque[RebalanceEvent] = deque()
        self.assigned: set[TopicPartition] = set()
        self.error: BaseException | None = None
        self._member: ConsumerProtocolMember | None = None
        self._conn: Connection | None = None
        self._wake = asyncio.Event()
        self._outstanding: RebalanceEvent | None = None
        self._rejoin = False
        self._closing = False
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------------ the application's side
    def subscribe(self, topics: list[str]) -> None:
        """Names, and patterns where a name starts with `^` (confluent-kafka's rule)."""
        self.patterns = [t for t in topics if t.startswith("^")]
        self.topics = sorted(t for t in topics if not t.startswith("^"))
        if self._member is not None:
            self._member.subscribe(self.topics, self._regex())
        self._rejoin = True
        self._wake.set()
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def _regex(self) -> str | None:
        return "|".join(f"(?:{p[1:]})" for p in self.patterns) if self.patterns else None

    def metadata(self) -> ConsumerGroupMetadata:
        """For send_offsets_to_transaction: KIP-447 fences a zombie by generation (the member
        epoch under KIP-848), member id and instance id."""
        return ConsumerGroupMetadata(self.config.group_id, self.generation, self.member_id, self.config.instance_id)

    def next_event(self) -> RebalanceEvent | None:
        while self.events:
            ev = self.events.popleft()
            if not ev.done.done():
                return ev
        return None

    # ------------------------------------------------------------------ the coordinator link
    async def _link(self) -> Connection:
        if self._conn is None or self._conn.closed:
            while True:
                try:
                    node = await find_coordinator(self.cluster, self.config.group_id)
                    break
                except AdminError as e:
                    # no coordinator for longer than a request timeout (its __consumer_offsets
                    # partition without a live leader: every broker restarting, say): a member
                    # keeps looking, as Kafka's clients do, instead of failing the consumer
                    if e.code not in RETRY_COORDINATOR or self._closing:
                        raise
                    log.warning("group %s: %s; still looking", self.config.group_id, e)
                    await self._wait(1.0)
            self._conn = await self.cluster.dedicated_connection(node)
        return self._conn

    def _unlink(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _ask(self, api_key: int, build, timeout_s: float | None = None, version: int | None = None):
        conn = await self._link()
        v = version if version is not None else conn.version(api_key)
        if v is None:
            raise KafkaClientError(f"the coordinator at {conn.addr} does not serve API key {api_key}")
        body = await asyncio.wait_for(conn.request(api_key, v, build(RequestBuilder(api_key, v))),
                                      timeout_s or self.cluster.timeout_s)
        return v, wire.decode(api_key, v, body)

    # ------------------------------------------------------------------ the membership task
    async def _run(self) -> None:
        try:
            protocol = self.config.protocol
            if protocol != "classic":
                protocol = await self._run_consumer(fall_back=protocol is None)
            if protocol == "classic" and not self._closing:
                await self._run_classic()
        except Exception as e:  # noqa: BLE001 - handed to the application at its next poll
            log.error("group %s: membership failed: %r", self.config.group_id, e)
            self.error = e
        finally:
            with contextlib.suppress(RuntimeError):   # a consumer never closed, collected after its loop
                self._wake.set()

    async def _wait(self, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        end = time.monotonic() + seconds
        while not self._closing and not until():
            left = end - time.monotonic()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return

    # ------------------------------------------------------------------ KIP-848
    async def _run_consumer(self, fall_back: bool) -> str | None:
        self.protocol = "consumer"
        m = self._member = ConsumerProtocolMember(str(uuid.uuid4()), self.config.instance_id,
                                                  self.config.max_poll_interval_ms, self.config.assignor)
        m.subscribe(self.topics, self._regex())
        self.member_id = m.member_id
        backoff = 0.05
        while not self._closing:
            try:
                conn = await self._link()
            except (KafkaClientError, BrokerConnectionError, TimeoutError) as e:
                log.debug("group %s: no coordinator yet: %r", self.config.group_id, e)
                await self._wait(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            if conn.version(ApiKey.CONSUMER_GROUP_HEARTBEAT) is None:
                if fall_back:
                    log.info("group %s: the coordinator does not serve KIP-848: classic protocol", self.config.group_id)
                    return "classic"
                raise GroupError(E.UNSUPPORTED_VERSION, "the coordinator does not serve ConsumerGroupHeartbeat")
            fields = m.request()
            try:
                _v, r = await self._ask(ApiKey.CONSUMER_GROUP_HEARTBEAT, lambda rq, f=fields: _heartbeat_body(
                    rq, self.config.group_id, f))
            except (BrokerConnectionError, TimeoutError) as e:
                log.debug("group %s: heartbeat failed: %r", self.config.group_id, e)
                m.failed()
                self._unlink()
                await self._wait(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            m.sent(fields)
            code = int(r.error_code)
            if code == E.UNSUPPORTED_VERSION and fall_back and m.epoch == 0 and not m.owned:
                log.info("group %s: the coordinator has KIP-848 turned off: classic protocol", self.config.group_id)
                return "classic"
            if code in _COORDINATOR_MOVED:
                self._unlink()
            if fields["member_epoch"] < 0:
                return None   # left
            assignment = None
            if r.assignment is not None:
                assignment = {t.topic_id: frozenset(int(p) for p in t.partitions)
                              for t in r.assignment.topic_partitions if t.topic_id is not None}
            if m.on_answer(code, r.error_message, int(r.member_epoch),
                           int(r.heartbeat_interval.total_seconds() * 1000), assignment):
                log.info("group %s: member %s is out (%s): its partitions are lost", self.config.group_id,
                         m.member_id, error_code(code).name)
                self._lose_all()
            self.generation = m.epoch
            await self._consumer_changes(m)
            await self._wait(m.interval_ms / 1000, m.urgent)
        return None

    async def _consumer_changes(self, m: ConsumerProtocolMember) -> None:
        """Start giving up or taking what the last answer asks, unless the application has yet to
        see the previous change."""
        if self._outstanding is not None and not self._outstanding.done.done():
            return
        ch = m.changes()
        if ch.revoke:
            tps = self._named(ch.revoke)
            await self._give_up(tps, lambda: m.revoked(ch.revoke))
        elif ch.assign:
            known = frozenset(tp for tp in ch.assign if tp[0] in self.cluster.topic_names)
            if len(known) < len(ch.assign):
                await self.cluster.refresh(None)  # topics created since the last metadata
                known = frozenset(tp for tp in ch.assign if tp[0] in self.cluster.topic_names)
            if known:
                await self._take(self._named(known))
                m.assigned(known)

    def _named(self, tps) -> list[TopicPartition]:
        return sorted(TopicPartition(self.cluster.topic_names[t], p) for t, p in tps if t in self.cluster.topic_names)

    # ------------------------------------------------------------------ classic
    async def _run_classic(self) -> None:
        self.protocol = "classic"
        self.member_id = ""
        while not self._closing:
            if self.assigned:
                await self._give_up(sorted(self.assigned), lambda: None, wait=True)
            try:
                assignment = await self._join_and_sync()
            except (BrokerConnectionError, TimeoutError) as e:
                log.debug("group %s: join failed: %r", self.config.group_id, e)
                self._unlink()
                await self._wait(0.2)
                continue
            if assignment is None:
                continue
            self._rejoin = False
            await self._take(assignment)
            await self._classic_heartbeats()

    async def _join_and_sync(self) -> list[TopicPartition] | None:
        """One JoinGroup and SyncGroup; None: join again."""
        topics = await self._classic_topics()
        protocol = (("range", encode_subscription(topics)),)
        rebalance_ms = self.config.max_poll_interval_ms
        code: int = E.MEMBER_ID_REQUIRED
        while code == E.MEMBER_ID_REQUIRED:
            _v, r = await self._ask(ApiKey.JOIN_GROUP, lambda rq: rq.encode(
                group_id=self.config.group_id, session_timeout=self.config.session_timeout_ms,
                rebalance_timeout=rebalance_ms, member_id=self.member_id, group_instance_id=self.config.instance_id,
                protocol_type="consumer", protocols=tuple(rq("JoinGroupRequestProtocol", name=n, metadata=md)
                                                          for n, md in protocol), reason=None),
                timeout_s=rebalance_ms / 1000 + self.cluster.timeout_s)
            code = int(r.error_code)
            if code == E.MEMBER_ID_REQUIRED:
                self.member_id = r.member_id
        if code != E.NONE:
            await self._classic_error(code, "JoinGroup")
            return None
        self.member_id, generation = r.member_id, int(r.generation_id)
        assignments: tuple = ()
        if r.leader == self.member_id:
            from oncelog.protocol.consumer_protocol import decode_subscription
            subs = {x.member_id: decode_subscription(x.metadata) for x in r.members}
            wanted = sorted({t for ts in subs.values() for t in ts})
            info = await self.cluster.refresh(wanted)
            counts = {n: len(t.partitions) for n, t in info.topics.items() if t.error_code == 0}
            plan = range_assignment(subs, counts)
            assignments = tuple((mid, encode_assignment(parts)) for mid, parts in plan.items())
        _v, s = await self._ask(ApiKey.SYNC_GROUP, lambda rq: rq.encode(
            group_id=self.config.group_id, generation_id=generation, member_id=self.member_id,
            group_instance_id=self.config.instance_id, protocol_type="consumer", protocol_name=r.protocol_name,
            assignments=tuple(rq("SyncGroupRequestAssignment", member_id=mid, assignment=a)
                              for mid, a in assignments)), timeout_s=rebalance_ms / 1000 + self.cluster.timeout_s)
        code = int(s.error_code)
        if code != E.NONE:
            await self._classic_error(code, "SyncGroup")
            return None
        self.generation = generation
        return [TopicPartition(t, p) for t, p in decode_assignment(s.assignment)]

    async def _classic_topics(self) -> list[str]:
        topics = set(self.topics)
        if self.patterns:  # classic groups match patterns on the client, against the metadata
            info = await self.cluster.refresh(None)
            for p in self.patterns:
                rx = re.compile(p[1:])
                topics |= {n for n in info.topics if rx.fullmatch(n) and not n.startswith("__")}
        return sorted(topics)

    async def _classic_error(self, code: int, what: str) -> None:
        """A join or sync refused: join again, or stop on a refusal that will not pass."""
        if code == E.UNKNOWN_MEMBER_ID:
            self.member_id = ""
        elif code in _COORDINATOR_MOVED:
            self._unlink()
        elif code not in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION):
            raise GroupError(code, what)
        await self._wait(0.05)

    async def _classic_heartbeats(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while not self._closing and not self._rejoin:
            await self._wait(interval, lambda: self._rejoin)
            if self._closing or self._rejoin:
                return
            try:
                _v, r = await self._ask(ApiKey.HEARTBEAT, lambda rq: rq.encode(
                    group_id=self.config.group_id, generation_id=self.generation, member_id=self.member_id,
                    group_instance_id=self.config.instance_id))
            except (BrokerConnectionError, TimeoutError):
                self._unlink()
                continue
            code = int(r.error_code)
            if code == E.NONE:
                continue
            if code in (E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION):
                self._lose_all()
                if code == E.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                return
            if code == E.REBALANCE_IN_PROGRESS:
                return
            if code in _COORDINATOR_MOVED:
                self._unlink()
                continue
            raise GroupError(code, "Heartbeat")

    # ------------------------------------------------------------------ partitions changing hands
    async def _give_up(self, tps: list[TopicPartition], then: Callable[[], None], wait: bool = False) -> None:
        if self.config.auto_commit:
            await self.commit_consumed(tps)

        def done() -> None:
            self.consumer._remove_partitions(tps)
            self.assigned -= set(tps)
            then()
            self._wake.set()
        ev = self._emit("revoke", tps, done)
        if wait:  # classic: the rejoin waits (the group waits for it, up to the rebalance timeout)
            await asyncio.shield(ev.done)

    async def _take(self, tps: list[TopicPartition]) -> None:
        positions = await self.committed(tps)
        self.consumer._add_partitions(positions)
        self.assigned |= set(tps)
        self._emit("assign", tps, lambda: None)

    def _lose_all(self) -> None:
        tps = sorted(self.assigned)
        if self._outstanding is not None and not self._outstanding.done.done():
            self._outstanding.done.cancel()
        self.consumer._remove_partitions(tps)
        self.assigned.clear()
        if self._member is not None:
            self._member.lost()
        if tps:
            self._emit("lost", tps, lambda: None)

    def _emit(self, kind: str, tps: list[TopicPartition], on_done: Callable[[], None]) -> RebalanceEvent:
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: None if f.cancelled() else on_done())
        ev = RebalanceEvent(kind, tps, fut)
        self.events.append(ev)
        if kind == "revoke":
            self._outstanding = ev
        self.consumer._wake_poll()
        log.info("group %s: %s %s", self.config.group_id, kind,
                 ", ".join(f"{tp.topic}-{tp.partition}" for tp in tps))
        return ev

    # ------------------------------------------------------------------ offsets
    async def commit(self, offsets: dict[TopicPartition, tuple[int, str | None]], retries: int = 5) -> None:
        """OffsetCommit at the coordinator, as this member (generation or member epoch); raises
        CommitFailedError when refused."""
        by_topic: dict[str, list[tuple[int, int, str | None]]] = {}
        for tp, (off, meta) in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append((tp.partition, off, meta))
        for attempt in range(retries + 1):
            try:
                _v, r = await self._ask(ApiKey.OFFSET_COMMIT, lambda rq: rq.encode(
                    group_id=self.config.group_id, generation_id=self.generation,
                    generation_id_or_member_epoch=self.generation, member_id=self.member_id,
                    group_instance_id=self.config.instance_id, retention_time=-1, topics=tuple(
                        rq("OffsetCommitRequestTopic", name=t, partitions=tuple(
                            rq("OffsetCommitRequestPartition", partition_index=p, committed_offset=o,
                               committed_leader_epoch=-1, committed_metadata=meta or "", commit_timestamp=-1)
                            for p, o, meta in ps))
                        for t, ps in by_topic.items())))
            except (BrokerConnectionError, TimeoutError) as e:
                self._unlink()
                if attempt == retries:
                    raise CommitFailedError(E.REQUEST_TIMED_OUT, f"commit of group {self.config.group_id}") from e
                await asyncio.sleep(0.1 * (attempt + 1))
                continue
            codes = {int(p.error_code) for t in r.topics for p in t.partitions} - {E.NONE}
            if not codes:
                return
            code = min(codes)
            if code in _COORDINATOR_MOVED or code == E.STALE_MEMBER_EPOCH:
                # a new coordinator, or an epoch moved by a heartbeat on its way: retry with the new one
                if code in _COORDINATOR_MOVED:
                    self._unlink()
                if attempt < retries:
                    await asyncio.sleep(0.1 * (attempt + 1))
                    continue
            raise CommitFailedError(code, f"commit of group {self.config.group_id}")

    async def commit_consumed(self, tps) -> None:
        """Auto-commit: what the application was given of these partitions (at-least-once)."""
        offsets: dict[TopicPartition, tuple[int, str | None]] = {
            tp: (off, None) for tp in tps if (off := self.consumer.consumed.get(tp)) is not None}
        if not offsets:
            return
        try:
            await self.commit(offsets)
        except KafkaClientError as e:
            log.warning("group %s: auto-commit failed: %s", self.config.group_id, e)

    async def committed(self, tps: list[TopicPartition], timeout_s: float | None = None
                        ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where there is none), waiting out offsets of a
        transaction not yet committed (UNSTABLE_OFFSET_COMMIT)."""
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        deadline = time.monotonic() + (timeout_s or self.cluster.timeout_s)
        while True:
            try:
                _v, r = await self._ask(ApiKey.OFFSET_FETCH, lambda rq: rq.encode(
                    group_id=self.config.group_id, require_stable=True, topics=tuple(
                        rq("OffsetFetchRequestTopic", name=t, partition_indexes=tuple(ps))
                        for t, ps in by_topic.items())))
            except (BrokerConnectionError, TimeoutError):
                self._unlink()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            code = int(r.error_code)
            codes = {int(p.error_code) for t in r.topics for p in t.partitions}
            retry = (code in _COORDINATOR_MOVED or E.UNSTABLE_OFFSET_COMMIT in codes
                     or codes & set(_COORDINATOR_MOVED))
            if retry and time.monotonic() < deadline:
                if code in _COORDINATOR_MOVED:
                    self._unlink()
                await asyncio.sleep(0.1)
                continue
            if code or codes - {E.NONE}:
                raise CommitFailedError(code or min(codes - {E.NONE}), f"committed offsets of {self.config.group_id}")
            return {TopicPartition(str(t.name), int(p.partition_index)):
                    (int(p.committed_offset) if p.committed_offset >= 0 else None)
                    for t in r.topics for p in t.partitions}

    # ------------------------------------------------------------------ leaving
    async def close(self) -> None:
        """Commit what was consumed (auto-commit), give up the partitions and leave the group
        (a static member of KIP-848 leaves for a while, epoch -2; a classic one does not leave)."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.assigned and self.error is None:
            try:   # on_revoke runs, as for any partition given up; not forever (the caller may not poll)
                await asyncio.wait_for(self._give_up(sorted(self.assigned), lambda: None, wait=True),
                                       self.cluster.timeout_s)
            except TimeoutError:
                log.warning("group %s: closing without on_revoke having run", self.config.group_id)
        try:
            await self._leave()
        except (KafkaClientError, BrokerConnectionError, TimeoutError) as e:
            log.info("group %s: leaving failed (the coordinator removes the member after its session): %r",
                     self.config.group_id, e)
        finally:
            self._unlink()

    async def _leave(self) -> None:
        if self.protocol == "consumer" and self._member is not None and self._member.epoch > 0:
            self._member.leaving = True
            fields = self._member.request()
            await self._ask(ApiKey.CONSUMER_GROUP_HEARTBEAT,
                            lambda rq: _heartbeat_body(rq, self.config.group_id, fields))
        elif self.protocol == "classic" and self.member_id and self.config.instance_id is None:
            await self._ask(ApiKey.LEAVE_GROUP, lambda rq: rq.encode(
                group_id=self.config.group_id, member_id=self.member_id, members=(
                    rq("MemberIdentity", member_id=self.member_id, group_instance_id=None, reason=None),)))


def _heartbeat_body(rq: RequestBuilder, group_id: str, fields: dict[str, Any]) -> bytes:
    owned = fields.get("topic_partitions")
    return rq.encode(
        group_id=group_id, member_id=fields["member_id"], member_epoch=fields["member_epoch"],
        instance_id=fields.get("instance_id"), rack_id=None, rebalance_timeout=fields.get("rebalance_timeout_ms", -1),
        subscribed_topic_names=fields.get("subscribed_topic_names"),
        subscribed_topic_regex=fields.get("subscribed_topic_regex"), server_assignor=fields.get("server_assignor"),
        topic_partitions=None if owned is None else tuple(
            rq("TopicPartitions", topic_id=t, partitions=tuple(sorted(ps))) for t, ps in sorted(owned.items())))
