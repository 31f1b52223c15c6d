"""Asyncio share consumer (KIP-932), in the conventions of confluent-kafka's `ShareConsumer`:
`subscribe`, `poll` returning the records acquired for this member (each with its delivery count),
`acknowledge(record, type)` in explicit mode, `commit_sync`/`commit_async`, `close`.

Membership: ShareGroupHeartbeat to the group's coordinator every heartbeat interval the broker
names (the member id is this client's, KIP-1082); an UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH
answer makes it join again. Records: ShareFetch to the leader of each assigned partition, one
share session per broker (epoch 0 opens it; a session error opens a new one, and the records the
old one held come back to the group by the broker's rules). Acknowledgements ride on the next
ShareFetch, or go at once with `commit_sync` (ShareAcknowledge).

`share.acknowledgement.mode`: `implicit` (the default) accepts every record of a poll at the
next poll or commit; `explicit` needs every record of a poll acknowledged (ACCEPT, RELEASE,
REJECT, or RENEW to keep it longer) before the next poll. Records not acknowledged go back to the
group when their lock runs out or the consumer closes."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from oncelog.client import config_keys
from oncelog.client.aio import wire
from oncelog.client.aio.admin_groups import find_coordinator
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.connection import BrokerConnectionError
from oncelog.client.errors import KafkaClientError
from oncelog.client.security import ClientSecurity
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.records import iter_record_batches

log = logging.getLogger("oncelog.client.share_consumer")
E = ErrorCode
ACCEPT, RELEASE, REJECT, RENEW = 1, 2, 3, 4
_REJOIN = {E.UNKNOWN_MEMBER_ID, E.FENCED_MEMBER_EPOCH}
_NEW_SESSION = {E.SHARE_SESSION_NOT_FOUND, E.INVALID_SHARE_SESSION_EPOCH}


class ShareRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()
    delivery_count: int = 1


class AIOShareConsumer:
    def __init__(self, config: dict) -> None:
        config_keys.check(config, "share consumer")
        if not config.get("bootstrap.servers"):
            raise KafkaClientError("bootstrap.servers is required")
        if not config.get("group.id"):
            raise KafkaClientError("group.id is required")
        self.config = dict(config)
        self.group_id = str(config["group.id"])
        mode = str(config.get("share.acknowledgement.mode", "implicit")).lower()
        if mode not in ("implicit", "explicit"):
            raise KafkaClientError("share.acknowledgement.mode must be implicit or explicit")
        self.explicit = mode == "explicit"
        self.max_records = int(config.get("max.poll.records", 500))
        self.max_wait_ms = int(config.get("fetch.max.wait.ms", 500))
        self.retry_backoff_s = int(config.get("retry.backoff.ms", 100)) / 1000
        self.cluster = Cluster(config["bootstrap.servers"], str(config.get("client.id", "oncelog-share-consumer")),
                               int(config.get("request.timeout.ms", 30000)), allow_auto_create=False,
                               address_map=config.get("oncelog.address.map"),
                               security=ClientSecurity.from_config(config))
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.topics: list[str] = []
        self.assigned: set[tuple[str, int]] = set()
        self.interval_s = 1.0
        self.sessions: dict[int, int] = {}                         # node -> next share session epoch
        self.session_parts: dict[int, set[tuple[str, int]]] = {}   # node -> partitions in its session
        self.pending: dict[tuple[str, int], dict[int, int]] = {}   # acknowledgements not sent: offset -> type
        self.unacked: dict[tuple[str, int, int], ShareRecord] = {}  # what the last poll returned
        self.buffer: deque[ShareRecord] = deque()
        self.lock_ms = -1
        self._hb: asyncio.Task | None = None
        self._left = False
        self.error: BaseException | None = None
        # per-partition error codes of ShareFetch answers, counted (what `oncelog verify` reports
        # per member: which client a broker's NOT_LEADER_OR_FOLLOWER answers went to)
        self.fetch_errors: Counter[int] = Counter()
        self._misled = False   # a partition answered an error in this fetch round (NOT_LEADER_OR_FOLLOWER, ...)

    async def start(self) -> AIOShareConsumer:
        await self.cluster.any_connection()
        return self

    # ------------------------------------------------------------------ membership
    def subscribe(self, topics: Iterable[str]) -> None:
        self.topics = sorted(set(topics))
        if not self.topics:
            raise KafkaClientError("subscribe needs at least one topic")
        self.epoch = 0 if self.epoch <= 0 else self.epoch
        self.cluster.want(self.topics)   # the refreshes after a NOT_LEADER_OR_FOLLOWER learn their leaders
        if self._hb is None:
            self._hb = asyncio.ensure_future(self._heartbeat_loop())

    async def _heartbeat(self, epoch: int) -> int:
        node = await find_coordinator(self.cluster, self.group_id)
        conn = await self.cluster.connection(node)
        rb = RequestBuilder(ApiKey.SHARE_GROUP_HEARTBEAT, 1)
        body = await conn.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, rb.encode(
            group_id=self.group_id, member_id=self.member_id, member_epoch=epoch, rack_id=None,
            subscribed_topic_names=tuple(self.topics) if epoch == 0 else None))
        r = wire.decode(ApiKey.SHARE_GROUP_HEARTBEAT, 1, body)
        code = int(r.error_code)
        if code == E.NONE and epoch >= 0:
            self.epoch = int(r.member_epoch)
            self.interval_s = max(0.05, r.heartbeat_interval.total_seconds())
            if r.assignment is not None:
                await self._assign({(tid, int(p)) for t in r.assignment.topic_partitions
                                    for tid in (t.topic_id,) for p in t.partitions})
        return code

    async def _assign(self, by_id: set[tuple[uuid.UUID, int]]) -> None:
        if any(tid not in self.cluster.topic_names for tid, _p in by_id):
            await self.cluster.refresh(self.topics)
        self.assigned = {(self.cluster.topic_names[tid], p) for tid, p in by_id if tid in self.cluster.topic_names}

    async def _heartbeat_loop(self) -> None:
        while not self._left:
            try:
                code = await self._heartbeat(self.epoch)
                if code in _REJOIN:
                    self.epoch = 0
                    continue
                if code == E.COORDINATOR_NOT_AVAILABLE or code == E.NOT_COORDINATOR:
                    await asyncio.sleep(0.1)
                    continue
                if code != E.NONE:
                    self.error = KafkaClientError(f"share group heartbeat: {ErrorCode(code).name}")
                    return
            except (BrokerConnectionError, TimeoutError, OSError, KafkaClientError) as e:
                log.debug("share group heartbeat failed: %r", e)
            await asyncio.sleep(self.interval_s)

    # ------------------------------------------------------------------ acknowledgement
    def acknowledge(self, record: ShareRecord, kind: int = ACCEPT) -> None:
        self.acknowledge_offset(record.topic, record.partition, record.offset, kind)

    def acknowledge_offset(self, topic: str, partition: int, offset: int, kind: int = ACCEPT) -> None:
        if kind not in (ACCEPT, RELEASE, REJECT, RENEW):
            raise ValueError(f"unknown acknowledge type {kind}")
        if (topic, partition, offset) not in self.unacked:
            raise KafkaClientError(f"{topic}-{partition}@{offset} is not in flight")
        if kind != RENEW:
            del self.unacked[(topic, partition, offset)]
        self.pending.setdefault((topic, partition), {})[offset] = kind

    def _implicit_acks(self) -> None:
        if not self.explicit:
            for (t, p, o) in list(self.unacked):
                self.acknowledge_offset(t, p, o, ACCEPT)

    # ------------------------------------------------------------------ fetching
    async def poll(self, timeout_s: float = 1.0) -> list[ShareRecord]:
        if self.error is not None:
            raise self.error
        if not self.topics:
            raise KafkaClientError("poll before subscribe")
        if self.explicit and any(k for k in self.unacked if self.pending.get(k[:2], {}).get(k[2]) != RENEW):
            raise KafkaClientError("explicit acknowledgement: every record of the last poll must be "
                                   "acknowledged before the next poll")
        self._implicit_acks()
        deadline = time.monotonic() + max(0.0, timeout_s)
        while not self.buffer:
            await self._fetch_round(max(0, int((deadline - time.monotonic()) * 1000)))
            if time.monotonic() >= deadline:
                break
            if not self.assigned:
                await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        out: list[ShareRecord] = []
        while self.buffer and len(out) < self.max_records:
            r = self.buffer.popleft()
            out.append(r)
            self.unacked[(r.topic, r.partition, r.offset)] = r
        return out

    def _topic_id(self, topic: str) -> uuid.UUID:
        tid = self.cluster.topic_ids[topic]
        assert isinstance(tid, uuid.UUID)  # metadata v10+ names topics by id; only those are kept
        return tid

    def _leaders(self, parts: Iterable[tuple[str, int]]) -> dict[int, set[tuple[str, int]]]:
        out: dict[int, set[tuple[str, int]]] = {}
        for topic, p in parts:
            t = self.cluster.topics.get(topic)
            leader = next((e.leader_id for e in (t.partitions if t else ()) if e.index == p), -1)
            if leader >= 0:
                out.setdefault(leader, set()).add((topic, p))
        return out

    async def _fetch_round(self, wait_ms: int) -> None:
        wanted = set(self.assigned) | {tp for tp, acks in self.pending.items() if acks}
        if not wanted:
            return
        if any(t not in self.cluster.topics for t, _p in wanted):
            await self.cluster.refresh(self.topics)
        by_node = self._leaders(wanted)
        calls = [self._share_fetch(node, parts, min(wait_ms, self.max_wait_ms)) for node, parts in by_node.items()]
        self._misled = False
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                log.debug("share fetch failed: %r", result)
                self._misled = True
        if self._misled:
            await self._after_error()

    async def _after_error(self) -> None:
        """A partition answered an error (NOT_LEADER_OR_FOLLOWER: the broker neither leads it nor
        coordinates the group now), or a request failed: learn the leaders again and back off
        `retry.backoff.ms` before the next ShareFetch, as Kafka's clients do. Such an answer comes
        at once, without the long poll: asking again at once spun, hundreds of requests a second
        to the same broker."""
        began = time.monotonic()
        await self.cluster.refreshed(self.retry_backoff_s)
        await asyncio.sleep(max(0.0, self.retry_backoff_s - (time.monotonic() - began)))

    def _ack_batches(self, rb: RequestBuilder, tp: tuple[str, int]) -> tuple[Any, ...]:
        acks = self.pending.pop(tp, {})
        out: list[tuple[int, int, int]] = []
        for offset in sorted(acks):
            kind = acks[offset]
            if out and out[-1][1] == offset - 1 and out[-1][2] == kind:
                out[-1] = (out[-1][0], offset, kind)
            else:
                out.append((offset, offset, kind))
        return tuple(rb("AcknowledgementBatch", first_offset=f, last_offset=la, acknowledge_types=(k,))
                     for f, la, k in out)

    async def _share_fetch(self, node: int, parts: set[tuple[str, int]], wait_ms: int, max_records: int | None = None,
                           epoch: int | None = None) -> dict[tuple[str, int], int]:
        """One ShareFetch to `node`, carrying the pending acknowledgements of `parts` unless it
        opens the share session (epoch 0: the broker refuses acknowledgements there, as Kafka's
        does, and they wait for the session's next request); returns the broker's answer to them
        per partition (an error code; a partition missing had none), or the request's error for
        every partition of `parts` when it failed."""
        conn = await self.cluster.connection(node)
        v = min(2, conn.version(ApiKey.SHARE_FETCH) or 1)
        rb = RequestBuilder(ApiKey.SHARE_FETCH, v)
        epoch = self.sessions.get(node, 0) if epoch is None else epoch
        known = self.session_parts.get(node, set()) if epoch != 0 else set()
        gone = known - parts
        renewing = epoch != 0 and any(k == RENEW for tp in parts for k in self.pending.get(tp, {}).values())
        topics: dict[uuid.UUID, list[Any]] = {}
        carried: set[tuple[str, int]] = set()
        for topic, p in sorted(parts):
            tid = self._topic_id(topic)
            batches = self._ack_batches(rb, (topic, p)) if epoch != 0 else ()
            if batches:
                carried.add((topic, p))
            topics.setdefault(tid, []).append(rb("FetchPartition", partition_index=p,
                                                 acknowledgement_batches=batches))
        forgotten: dict[uuid.UUID, list[int]] = {}
        for topic, p in gone:
            forgotten.setdefault(self._topic_id(topic), []).append(p)
        n = self.max_records if max_records is None else max_records
        body = await conn.request(ApiKey.SHARE_FETCH, v, rb.encode(
            group_id=self.group_id, member_id=self.member_id, share_session_epoch=epoch, max_wait=wait_ms,
            min_bytes=1, max_bytes=52428800, max_records=0 if renewing else n, batch_size=n,
            share_acquire_mode=1, is_renew_ack=renewing,
            topics=tuple(rb("FetchTopic", topic_id=tid, partitions=tuple(ps)) for tid, ps in topics.items()),
            forgotten_topics_data=tuple(rb("ForgottenTopic", topic_id=tid, partitions=tuple(ps))
                                        for tid, ps in forgotten.items())))
        r = wire.decode(ApiKey.SHARE_FETCH, v, body)
        code = int(r.error_code)
        if code != E.NONE:
            self.sessions.pop(node, None)
            self.session_parts.pop(node, None)
            if code not in _NEW_SESSION:   # (a session error: a new session at once)
                log.info("share fetch from broker %d: %s", node, ErrorCode(code).name)
                self._misled = True
            # acknowledgements of that session are lost: those records come back by the broker's rules
            return dict.fromkeys(carried or parts, code)
        acked = {(self.cluster.topic_names.get(t.topic_id, "?"), int(p.partition_index)): int(p.acknowledge_error_code)
                 for t in r.responses for p in t.partitions}
        answers = {tp: acked[tp] for tp in carried if tp in acked}
        if epoch == -1:
            self.sessions.pop(node, None)
            self.session_parts.pop(node, None)
            return answers
        self.sessions[node] = epoch + 1 if epoch < 2**31 - 1 else 1
        self.session_parts[node] = set(parts)
        self.lock_ms = int(r.acquisition_lock_timeout.total_seconds() * 1000)
        for t in r.responses:
            name = self.cluster.topic_names.get(t.topic_id)
            if name is None:
                continue
            topic = name
            for p in t.partitions:
                tp = (topic, int(p.partition_index))
                if int(p.acknowledge_error_code):
                    log.info("acknowledgements of %s-%d refused: %s", *tp, int(p.acknowledge_error_code))
                if int(p.error_code):
                    self.fetch_errors[int(p.error_code)] += 1
                    log.debug("share fetch of %s-%d from broker %d: %s", *tp, node, ErrorCode(int(p.error_code)).name)
                    self._misled = True
                    continue
                self._take(tp, p.records, [(int(a.first_offset), int(a.last_offset), int(a.delivery_count))
                                           for a in p.acquired_records])
        return answers

    def _take(self, tp: tuple[str, int], data: bytes | None, acquired: list[tuple[int, int, int]]) -> None:
        if not data or not acquired:
            return
        counts: dict[int, int] = {}
        for first, last, count in acquired:
            for o in range(first, last + 1):
                counts[o] = count
        for header, records in iter_record_batches(data):
            if header.is_control:
                continue
            for r in records:
                c = counts.pop(r.offset, None)
                if c is not None:
                    self.buffer.append(ShareRecord(tp[0], tp[1], r.offset, r.timestamp, r.timestamp_type, r.key,
                                                   r.value, r.headers, c))
        # acquired offsets the batches did not hold (compacted away, control): acknowledged as gaps
        for o in counts:
            self.pending.setdefault(tp, {})[o] = 0

    # ------------------------------------------------------------------ commits and close
    async def commit_sync(self) -> dict[tuple[str, int], int]:
        """Send the pending acknowledgements now (ShareAcknowledge); {partition: error code}."""
        self._implicit_acks()
        results: dict[tuple[str, int], int] = {}
        wanted = {tp for tp, acks in self.pending.items() if acks}
        for node, parts in self._leaders(wanted).items():
            results.update(await self._share_acknowledge(node, parts))
        return results

    async def _share_acknowledge(self, node: int, parts: set[tuple[str, int]], epoch: int | None = None
                                 ) -> dict[tuple[str, int], int]:
        epoch = self.sessions.get(node) if epoch is None else epoch
        if epoch is None:   # no session with that broker: a ShareFetch opens one, fetching nothing
            opened = await self._share_fetch(node, parts | self.session_parts.get(node, set()), 0, max_records=0)
            epoch = self.sessions.get(node)
            if epoch is None:   # not opened: the acknowledgements are not sent, and say why
                for tp in parts:
                    self.pending.pop(tp, None)
                return {tp: opened.get(tp, E.UNKNOWN_SERVER_ERROR) for tp in parts}
        conn = await self.cluster.connection(node)
        v = min(2, conn.version(ApiKey.SHARE_ACKNOWLEDGE) or 1)
        rb = RequestBuilder(ApiKey.SHARE_ACKNOWLEDGE, v)
        topics: dict[uuid.UUID, list[Any]] = {}
        for topic, p in sorted(parts):
            topics.setdefault(self._topic_id(topic), []).append(rb(
                "AcknowledgePartition", partition_index=p,
                acknowledgement_batches=self._ack_batches(rb, (topic, p))))
        renewing = False
        body = await conn.request(ApiKey.SHARE_ACKNOWLEDGE, v, rb.encode(
            group_id=self.group_id, member_id=self.member_id, share_session_epoch=epoch, is_renew_ack=renewing,
            topics=tuple(rb("AcknowledgeTopic", topic_id=tid, partitions=tuple(ps)) for tid, ps in topics.items())))
        r = wire.decode(ApiKey.SHARE_ACKNOWLEDGE, v, body)
        code = int(r.error_code)
        if code != E.NONE or epoch == -1:
            self.sessions.pop(node, None)
            self.session_parts.pop(node, None)
            if code != E.NONE:
                return {tp: code for tp in parts}
        else:
            self.sessions[node] = epoch + 1 if epoch < 2**31 - 1 else 1
        return {(self.cluster.topic_names.get(t.topic_id, "?"), int(p.partition_index)): int(p.error_code)
                for t in r.responses for p in t.partitions}

    async def close(self) -> None:
        """Sends the pending acknowledgements, closes the share sessions (what is still held goes
        back to the group) and leaves the group."""
        try:
            self._implicit_acks()
            for node in list(self.sessions):
                parts = {tp for tp, acks in self.pending.items() if acks} & self._leaders(
                    self.pending).get(node, set())
                try:
                    await self._share_acknowledge(node, parts, epoch=-1)
                except (BrokerConnectionError, TimeoutError, OSError, KafkaClientError) as e:
                    log.debug("closing the share session with broker %d: %r", node, e)
            self._left = True
            if self._hb is not None:
                self._hb.cancel()
                if self.epoch > 0:
                    try:
                        await self._heartbeat(-1)
                    except (BrokerConnectionError, TimeoutError, OSError, KafkaClientError) as e:
                        log.debug("leaving the share group: %r", e)
        finally:
            self.cluster.close()

    async def __aenter__(self) -> AIOShareConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
