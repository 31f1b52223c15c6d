"""Asyncio consumer: manual assignment (assign, seek) or a consumer group (subscribe; membership in
`aio.group`), poll (Fetch), offsets (ListOffsets), commits (commit, committed).

In a group, `enable.auto.commit` (default true, as Kafka's clients) commits, every
`auto.commit.interval.ms` and before partitions are given up or the consumer closes, the position
after the last record each partition handed to the application: at-least-once, Kafka's semantics
(a record is committed only once poll returned it; a crash re-reads what was returned since the
last commit). `commit()` with no offsets commits the same positions.

`isolation.level` (Kafka's name and values; default read_uncommitted, as the Java client):
read_committed asks Fetch and ListOffsets for isolation level 1, so the broker stops at the last
stable offset, and drops the batches of aborted transactions with the AbortedTransactions list
of each response (`core.txn.ReadCommittedFilter`, batch by batch). Control batches are never
returned in either mode; the position steps over them, so offsets have gaps."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from oncelog.client import config_keys
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.connection import BrokerConnectionError
from oncelog.client.aio.group import AIOGroup, GroupConfig, RebalanceEvent
from oncelog.client.aio.list_offsets import leader_of, list_offsets
from oncelog.client.errors import KafkaClientError
from oncelog.client.security import ClientSecurity
from oncelog.client.types import EARLIEST, LATEST, ConsumerGroupMetadata, ConsumerRecord, TopicPartition
from oncelog.core.txn.read_committed import ReadCommittedFilter
from oncelog.protocol import fetch
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import ErrorCode, error_code
from oncelog.protocol.records import is_abort_marker_batch, iter_batches, iter_record_batches
from oncelog.protocol.records.control import ABORT, control_type

log = logging.getLogger("oncelog.client.consumer")

_REFRESH = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
            ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR}


def _tp(tp) -> TopicPartition:
    return TopicPartition(tp[0], tp[1])


class AIOConsumer:
    def __init__(self, config: dict) -> None:
        config_keys.check(config, "consumer")
        servers = config.get("bootstrap.servers")
        if not servers:
            raise KafkaClientError("bootstrap.servers is required")
        self.config = dict(config)
        self.cluster = Cluster(servers, str(config.get("client.id", "oncelog-consumer")),
                               int(config.get("request.timeout.ms", 30000)), allow_auto_create=False,
                               address_map=config.get("oncelog.address.map"),
                               security=ClientSecurity.from_config(config))
        # latest, as every Kafka client: a new group (or an assigned partition without a position)
        # reads what is produced from now on; set earliest to read what is there already
        self.reset = str(config.get("auto.offset.reset", "latest")).lower()
        if self.reset not in ("earliest", "latest", "none"):
            raise KafkaClientError("auto.offset.reset must be earliest, latest or none")
        self.max_wait_ms = int(config.get("fetch.max.wait.ms", 500))
        self.min_bytes = int(config.get("fetch.min.bytes", 1))
        self.max_bytes = int(config.get("fetch.max.bytes", 52428800))
        self.partition_max_bytes = int(config.get("max.partition.fetch.bytes", 1048576))
        self.check_crcs = str(config.get("check.crcs", "true")).lower() != "false"
        isolation = str(config.get("isolation.level", "read_uncommitted")).lower()
        if isolation not in ("read_uncommitted", "read_committed"):
            raise KafkaClientError("isolation.level must be read_uncommitted or read_committed")
        self.isolation_level = 1 if isolation == "read_committed" else 0
        self.positions: dict[TopicPartition, int | None] = {}
        self._paused: set[TopicPartition] = set()   # assigned, not fetched until resumed
        # the position after the last record poll returned, per partition: what commits commit
        self.consumed: dict[TopicPartition, int] = {}
        self.group: AIOGroup | None = None
        self._polled_metadata: ConsumerGroupMetadata | None = None   # the group metadata of the latest poll
        self.callbacks: dict[str, object] = {}
        self._poll_wake = asyncio.Event()
        self._next_auto_commit = 0.0
        self.buffer: deque[ConsumerRecord] = deque()
        # raw mode (poll_raw): whole record batches per partition, decoded by the caller
        self.raw = False
        self.raw_buffer: list[tuple[TopicPartition, int, bytes | memoryview]] = []
        self.high_watermarks: dict[TopicPartition, int] = {}

    async def start(self) -> AIOConsumer:
        await self.cluster.any_connection()
        return self

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()

    def __aiter__(self):
        return self

    async def __anext__(self) -> ConsumerRecord:
        """`async for record in consumer`: aiokafka's iteration, one record at a time, waiting
        as long as it takes (end it with break, or close the consumer from another task)."""
        while not self.buffer:
            if self.cluster.closed:
                raise StopAsyncIteration
            await self.poll(1.0, 0)   # fills the buffer, returns nothing
        return self._take(1)[0]

    async def close(self, run_callbacks: bool = True) -> None:
        """Gives up its partitions (committing what was consumed, with enable.auto.commit; then
        on_revoke), leaves the group and closes."""
        try:
            if self.group is not None:
                await self._leave_group(self.group, run_callbacks)
        finally:
            self.cluster.close()

    async def _leave_group(self, group: AIOGroup, run_callbacks: bool) -> None:
        """The group's close (a last commit, on_revoke, LeaveGroup), running the callbacks it
        queues while it waits, unless the caller runs them."""
        closing = asyncio.ensure_future(group.close())
        while not closing.done():
            if run_callbacks:
                await self._run_callbacks()
            await asyncio.wait([closing], timeout=0.05)
        await closing

    # ------------------------------------------------------------------ group membership

    def subscribe(self, topics, on_assign=None, on_revoke=None, on_lost=None) -> None:
        """Join `group.id` and read the partitions its coordinator assigns (confluent-kafka's
        names; a topic starting with `^` is a regex). The callbacks, `(consumer, partitions)`,
        run during poll: on_revoke before partitions go (they may still be committed), on_assign
        once new ones are added (a seek there sets where reading starts), on_lost when the
        member was fenced (else on_revoke)."""
        if not self.config.get("group.id"):
            raise KafkaClientError("subscribe needs group.id in the consumer config")
        if self.group is None:
            if self.positions:
                raise KafkaClientError("subscribe after assign: a consumer is assigned or subscribed, not both")
            self.group = AIOGroup(self, GroupConfig.from_dict(self.config))
            self._next_auto_commit = time.monotonic() + self.group.config.auto_commit_interval_ms / 1000
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        self.group.subscribe(list(topics))

    async def unsubscribe(self, run_callbacks: bool = True) -> None:
        """Leave the group (committing what was consumed, with enable.auto.commit; on_revoke runs
        for the partitions given up) or drop the assignment of `assign`, as Kafka's unsubscribe;
        subscribe or assign may follow. `run_callbacks` False: the caller runs them (the sync
        facade, in its own thread)."""
        if self.group is not None:
            try:
                await self._leave_group(self.group, run_callbacks)
            finally:
                self.group = None
        self.positions = {}
        self.consumed = {}
        self._paused = set()
        self.buffer.clear()
        self.raw_buffer.clear()

    def pause(self, partitions) -> None:
        """Stop fetching these assigned partitions until `resume` (Kafka's pause: the group
        membership goes on; records of them fetched but not yet returned are dropped and fetched
        again after resume)."""
        for tp in partitions:
            key = _tp(tp)
            if key not in self.positions:
                raise KafkaClientError(f"pause: {key.topic}-{key.partition} is not assigned")
            self._paused.add(key)
            self._unbuffer(key)

    def resume(self, partitions) -> None:
        for tp in partitions:
            self._paused.discard(_tp(tp))

    def paused(self) -> list[TopicPartition]:
        return sorted(self._paused, key=lambda tp: (tp.topic, tp.partition))

    def _unbuffer(self, key: TopicPartition) -> None:
        """Records of `key` fetched but not returned are dropped and the position goes back to
        the first of them, so that they are fetched again."""
        first = next((r.offset for r in self.buffer if TopicPartition(r.topic, r.partition) == key), None)
        if first is None:
            first = next((at for tp, at, _data in self.raw_buffer if tp == key), None)
        if first is not None:
            self.positions[key] = first
        self.buffer = deque(r for r in self.buffer if TopicPartition(r.topic, r.partition) != key)
        self.raw_buffer = [x for x in self.raw_buffer if x[0] != key]

    def _add_partitions(self, positions: dict[TopicPartition, int | None]) -> None:
        for tp, off in positions.items():
            key = _tp(tp)
            self.positions[key] = off
            if off is not None:
                self.consumed[key] = off

    def _remove_partitions(self, tps) -> None:
        gone = {_tp(tp) for tp in tps}
        for tp in gone:
            self.positions.pop(tp, None)
            self.consumed.pop(tp, None)
            self._paused.discard(tp)
        # keyed as TopicPartition (offset None): a plain (topic, partition) pair never equals one
        self.buffer = deque(r for r in self.buffer if TopicPartition(r.topic, r.partition) not in gone)
        self.raw_buffer = [x for x in self.raw_buffer if x[0] not in gone]

    def _wake_poll(self) -> None:
        self._poll_wake.set()

    def next_event(self) -> RebalanceEvent | None:
        """The next rebalance event the application has not seen (the sync facade runs its
        callback in the caller's thread, then calls `event_done`)."""
        if self.group is not None and self.group.error is not None:
            raise self.group.error
        return self.group.next_event() if self.group is not None else None

    def event_done(self, ev: RebalanceEvent) -> None:
        if not ev.done.done():
            ev.done.set_result(None)

    async def _run_callbacks(self) -> None:
        while (ev := self.next_event()) is not None:
            callback = self.callbacks.get(ev.kind) or (self.callbacks.get("revoke") if ev.kind == "lost" else None)
            try:
                if callback is not None:
                    result = callback(self, list(ev.partitions))  # type: ignore[operator]
                    if asyncio.iscoroutine(result):
                        await result
            finally:
                self.event_done(ev)

    async def commit(self, message=None, offsets=None, asynchronous: bool = False):
        """Commit `offsets` (TopicPartitions with offsets), the position after `message`, or the
        positions of everything poll returned; returns the partitions committed (a task of them
        when `asynchronous`). Raises CommitFailedError when the coordinator refuses."""
        if self.group is None and not self.config.get("group.id"):
            raise KafkaClientError("commit needs group.id in the consumer config")
        wanted: dict[TopicPartition, tuple[int, str | None]]
        if message is not None:
            wanted = {TopicPartition(message.topic, message.partition): (message.offset + 1, None)}
        elif offsets is not None:
            wanted = {_tp(tp): (int(tp[2]), None) for tp in offsets}
        else:
            wanted = {tp: (off, None) for tp, off in self.consumed.items()}
        if not wanted:
            raise KafkaClientError("nothing to commit: no offsets given and nothing consumed")
        committing = self._commit(wanted)
        if asynchronous:
            return asyncio.ensure_future(committing)
        return await committing

    async def _commit(self, wanted: dict[TopicPartition, tuple[int, str | None]]) -> list[TopicPartition]:
        if self.group is not None:
            await self.group.commit(wanted)
        else:   # a consumer outside any group commits as the admin client does (generation -1)
            from oncelog.client.aio.admin import AIOAdminClient
            admin = AIOAdminClient({**self.config, "client.id": self.cluster.client_id})
            try:
                await admin.alter_group_offsets(str(self.config["group.id"]), {tp: o for tp, (o, _m) in wanted.items()})
            finally:
                await admin.close()
        return [TopicPartition(tp.topic, tp.partition, off) for tp, (off, _m) in sorted(wanted.items())]

    async def committed(self, partitions, timeout_s: float | None = None) -> list[TopicPartition]:
        """The group's committed offsets of `partitions` (offset None where there is none)."""
        tps = [_tp(tp) for tp in partitions]
        if self.group is None:
            from oncelog.client.aio.admin import AIOAdminClient
            admin = AIOAdminClient({**self.config, "client.id": self.cluster.client_id})
            try:
                found: dict[TopicPartition, int | None] = dict(
                    await admin.list_group_offsets(str(self.config["group.id"])))
            finally:
                await admin.close()
        else:
            found = await self.group.committed(tps, timeout_s)
        return [TopicPartition(tp.topic, tp.partition, found.get(tp)) for tp in tps]

    async def _auto_commit(self) -> None:
        g = self.group
        if g is None or not g.config.auto_commit or time.monotonic() < self._next_auto_commit:
            return
        self._next_auto_commit = time.monotonic() + g.config.auto_commit_interval_ms / 1000
        await g.commit_consumed(sorted(g.assigned))

    # ------------------------------------------------------------------ assignment

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """What `send_offsets_to_transaction` needs: a subscribed consumer's generation (its
        member epoch under KIP-848), member id and instance id, so the coordinator fences a zombie
        (KIP-447); an assigned one's is that of a group used only to commit offsets (`group.id`;
        generation -1, no member id), which the coordinator accepts while the group has no
        members.

        The generation is the one of the latest poll, as Java's consumer updates what the
        application sees of its group only in poll: records are committed with the epoch they
        were polled under, so a member fenced and rejoined since (it was paused, say) has its
        commit refused instead of committing, with its new epoch, records of partitions it lost
        (issue 34's pause fault found it)."""
        if self.group is not None:
            return self._polled_metadata or self.group.metadata()
        group = self.config.get("group.id")
        if not group:
            raise KafkaClientError("consumer_group_metadata needs group.id in the consumer config")
        return ConsumerGroupMetadata(str(group))

    def assign(self, tps) -> None:
        if self.group is not None:
            raise KafkaClientError("assign after subscribe: a consumer is assigned or subscribed, not both")
        self.positions = {}
        self._paused = set()
        for tp in tps:
            self.positions[_tp(tp)] = tp[2] if len(tp) > 2 and tp[2] is not None and tp[2] >= 0 else None
        self.buffer.clear()
        self.raw_buffer.clear()

    def assignment(self) -> list[TopicPartition]:
        return list(self.positions)

    def seek(self, tp, offset: int) -> None:
        key = _tp(tp)
        if key not in self.positions:
            raise KafkaClientError(f"{key.topic}-{key.partition} is not assigned")
        self.positions[key] = offset
        # records fetched before the seek must not be returned after it (a rewind would read
        # them twice); compared as TopicPartition, as a (topic, partition) pair never equals one
        self.buffer = deque(r for r in self.buffer if TopicPartition(r.topic, r.partition) != key)
        self.raw_buffer = [x for x in self.raw_buffer if x[0] != key]

    def position(self, tp) -> int | None:
        return self.positions.get(_tp(tp))

    # ------------------------------------------------------------------ offsets

    async def list_offsets(self, tps, timestamp) -> dict[TopicPartition, int | None]:
        """ListOffsets for each partition; `timestamp` is EARLIEST, LATEST, a time in ms, or a
        dict {tp: timestamp}."""
        return await list_offsets(self.cluster, tps, timestamp, self.isolation_level)

    # EARLIEST and LATEST always find an offset: no None in these two
    async def beginning_offsets(self, tps) -> dict[TopicPartition, int]:
        return await self.list_offsets(tps, EARLIEST)  # type: ignore[return-value]

    async def end_offsets(self, tps) -> dict[TopicPartition, int]:
        return await self.list_offsets(tps, LATEST)  # type: ignore[return-value]

    async def offsets_for_times(self, timestamps: dict) -> dict[TopicPartition, int | None]:
        return await self.list_offsets(list(timestamps), {_tp(k): v for k, v in timestamps.items()})

    async def list_topics(self) -> dict[str, int]:
        info = await self.cluster.refresh(None)
        return {n: len(t.partitions) for n, t in info.topics.items() if t.error_code == 0}

    # ------------------------------------------------------------------ polling

    async def _resolve_positions(self) -> None:
        missing = [tp for tp, off in self.positions.items() if off is None]
        if not missing:
            return
        if self.reset == "none":
            raise KafkaClientError(f"no position for {missing} and auto.offset.reset=none")
        offs = await self.list_offsets(missing, EARLIEST if self.reset == "earliest" else LATEST)
        for tp, off in offs.items():
            if tp in self.positions and self.positions[tp] is None:
                self.positions[tp] = off or 0
                self.consumed.setdefault(tp, off or 0)

    async def poll(self, timeout_s: float = 1.0, max_records: int | None = None,
                   run_callbacks: bool = True) -> list[ConsumerRecord]:
        """Records, after the rebalance callbacks due (`run_callbacks` False: return early
        instead when one is due; the sync facade runs them in its caller's thread). The group
        metadata `consumer_group_metadata` gives is the one of the latest poll."""
        try:
            return await self._poll(timeout_s, max_records, run_callbacks)
        finally:
            self._polled_metadata = self.group.metadata() if self.group is not None else None

    async def _poll(self, timeout_s: float, max_records: int | None, run_callbacks: bool) -> list[ConsumerRecord]:
        self.raw = False
        deadline = time.monotonic() + timeout_s
        while True:
            if self.group is not None:
                if run_callbacks:
                    await self._run_callbacks()
                elif self.group.events or self.group.error is not None:
                    return []
                await self._auto_commit()
            if self.buffer:
                return self._take(max_records)
            if not self.positions:
                if self.group is None:
                    await asyncio.sleep(max(0.0, min(timeout_s, 0.05)))
                    return []
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._poll_wake.clear()   # set when the group hands out partitions
                try:
                    await asyncio.wait_for(self._poll_wake.wait(), min(left, 0.1))
                except TimeoutError:
                    pass
                continue
            await self._resolve_positions()
            remaining = deadline - time.monotonic()
            wait_ms = max(0, min(self.max_wait_ms, int(remaining * 1000)))
            await self._fetch_once(wait_ms)
            if self.buffer or time.monotonic() >= deadline:
                return self._take(max_records)

    def _take(self, max_records: int | None) -> list[ConsumerRecord]:
        n = len(self.buffer) if max_records is None else min(max_records, len(self.buffer))
        out = [self.buffer.popleft() for _ in range(n)]
        for r in out:
            self.consumed[TopicPartition(r.topic, r.partition)] = r.offset + 1
        return out

    async def poll_raw(self, timeout_s: float = 1.0) -> list[tuple[TopicPartition, int, bytes | memoryview]]:
        """Whole record batches instead of records, for columnar readers (the Spark connector):
        (partition, the position fetched from, its complete batches as fetched). Positions move
        past those batches; the first batch may begin before the position. Checking CRCs and
        decoding is the caller's."""
        self.raw = True
        deadline = time.monotonic() + timeout_s
        while True:
            if self.raw_buffer or not self.positions:
                out, self.raw_buffer = self.raw_buffer, []
                return out
            await self._resolve_positions()
            remaining = deadline - time.monotonic()
            await self._fetch_once(max(0, min(self.max_wait_ms, int(remaining * 1000))))
            if not self.raw_buffer and time.monotonic() >= deadline:
                return []

    async def _fetch_once(self, wait_ms: int) -> None:
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in self.positions:
            if tp in self._paused:
                continue
            try:
                by_leader.setdefault(await leader_of(self.cluster, tp), []).append(tp)
            except KafkaClientError as e:
                log.debug("no leader for %s: %r", tp, e)
        if not by_leader:
            await asyncio.sleep(0.05)
            return
        results = await asyncio.gather(*(self._fetch_from(leader, tps, wait_ms) for leader, tps in by_leader.items()),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                log.debug("fetch failed: %r", r)
                if not isinstance(r, (BrokerConnectionError, asyncio.TimeoutError, KafkaClientError)):
                    raise r
                await asyncio.sleep(0.05)

    async def _fetch_from(self, leader: int, tps: list[TopicPartition], wait_ms: int) -> None:
        conn = await self.cluster.connection(leader)
        v = conn.version(ApiKey.FETCH)
        if v is None:
            raise KafkaClientError("broker does not support Fetch v4+")
        # a rebalance may have revoked some of them while the leader and connection were found
        tps = [tp for tp in tps if tp in self.positions]
        if not tps:
            return
        rq = RequestBuilder(ApiKey.FETCH, v)
        topics: dict[str, list] = {}
        fetched = {tp: self.positions[tp] for tp in tps}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(rq(
                "FetchPartition", partition=tp.partition, current_leader_epoch=-1,
                fetch_offset=self.positions[tp], last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=self.partition_max_bytes))
        req = rq.encode(replica_id=-1, max_wait=wait_ms, min_bytes=self.min_bytes,
                        max_bytes=self.max_bytes, isolation_level=self.isolation_level, session_id=0, session_epoch=-1,
                        topics=tuple(rq("FetchTopic", topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
                        forgotten_topics_data=(), rack_id="", cluster_id=None)
        body = await asyncio.wait_for(conn.request(ApiKey.FETCH, v, req),
                                      self.cluster.timeout_s + wait_ms / 1000)
        self._on_fetch_response(v, body, fetched)

    def _on_fetch_response(self, v: int, body, fetched: dict[TopicPartition, int | None] | None = None) -> None:
        """Records and errors of one Fetch response; an error code, known or not, is its
        partition's alone. `fetched`: the positions asked for, so that a partition sought (or
        revoked and assigned again) while the Fetch was out is left alone."""
        r = fetch.decode_response(v, body)
        if r.error_code:
            raise KafkaClientError(f"Fetch: {error_code(r.error_code).name}")
        for topic, partitions in r.topics:
            for p in partitions:
                tp = TopicPartition(topic, p.index)
                if tp not in self.positions or tp in self._paused:
                    continue   # paused while the Fetch was out: fetched again after resume
                if fetched is not None and self.positions[tp] != fetched.get(tp):
                    continue   # stale: its records would land at, and move, the new position
                if p.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    if self.reset == "none":
                        raise KafkaClientError(f"offset {self.positions[tp]} out of range for {tp}")
                    log.warning("%s-%d: offset %s out of range, resetting to %s", tp.topic,
                                tp.partition, self.positions[tp], self.reset)
                    self.positions[tp] = None
                    continue
                if p.error_code:
                    if p.error_code in _REFRESH:
                        self.cluster.request_refresh()
                    log.debug("fetch %s: %s", tp, error_code(p.error_code).name)
                    continue
                self.high_watermarks[tp] = p.high_watermark
                records = p.records
                if records:
                    assert isinstance(records, (bytes, memoryview))  # decode_response reads views
                    keep = ReadCommittedFilter(p.aborted_transactions or ()) if self.isolation_level else None
                    (self._add_raw if self.raw else self._add_records)(tp, records, keep)

    def _add_raw(self, tp: TopicPartition, data: bytes | memoryview, keep: ReadCommittedFilter | None = None) -> None:
        pos = self.positions[tp]
        assert pos is not None  # fetched from a resolved position
        end = last = None
        kept, dropped = [], False
        for at, header in iter_batches(data, strict=True):
            end, last = at + header.size, header.last_offset
            if keep is not None and not keep.accept(
                    header.producer_id, header.last_offset, header.is_transactional, header.is_control,
                    header.is_control and is_abort_marker_batch(data, at, header)):
                dropped = True
                continue
            kept.append((at, end))
        if last is None or last < pos:
            return
        view = memoryview(data)
        # read_committed: the batches it keeps, joined only when one was left out
        self.raw_buffer.append((tp, pos, b"".join(view[a:e] for a, e in kept) if dropped else view[:end]))
        self.positions[tp] = last + 1

    def _add_records(self, tp: TopicPartition, data: bytes | memoryview,
                     keep: ReadCommittedFilter | None = None) -> None:
        pos = self.positions[tp]
        assert pos is not None  # fetched from a resolved position
        topic, part = tp.topic, tp.partition
        last = None
        for header, records in iter_record_batches(data, check_crc=self.check_crcs):
            if keep is not None:
                abort = header.is_control and bool(records) and control_type(records[0].key) == ABORT
                if not keep.accept(header.producer_id, header.last_offset, header.is_transactional,
                                   header.is_control, abort):
                    last = header.last_offset
                    continue
            if header.last_offset < pos:
                continue
            if header.is_control:
                last = header.last_offset
                continue
            for r in records:
                if r.offset >= pos:
                    self.buffer.append(ConsumerRecord(topic, part, r.offset, r.timestamp,
                                                      r.timestamp_type, r.key, r.value, r.headers))
            last = header.last_offset
        if last is not None and last + 1 > pos:
            self.positions[tp] = last + 1
