"""Drives a ProducerCore against ModelPartitions without I/O: requests are lists of batches that
the test delivers, fails or answers with injected errors, in any order."""
from __future__ import annotations

from model_broker import ModelPartition

from oncelog.client.config import ProducerConfig
from oncelog.client.producer_core import PartitionResult, ProducerCore
from oncelog.client.types import TopicPartition
from oncelog.protocol.errors import ErrorCode as E


class Request:
    def __init__(self, node: int, batches: list) -> None:
        self.node = node
        self.batches = batches
        # what went on the wire, as it was then (a batch object may be renumbered later)
        self.sent = [(b.tp, b.producer_id, b.producer_epoch, b.base_sequence, list(b.cookies))
                     for b in batches]
        self.results: list | None = None  # set once the broker processed it

    def __repr__(self) -> str:
        return f"Request(node={self.node}, {self.batches})"


class Harness:
    def __init__(self, cfg: dict | None = None, **partitions: ModelPartition) -> None:
        base = {"bootstrap.servers": "model:9092", "linger.ms": 0, "retry.backoff.ms": 0}
        base.update(cfg or {})
        self.core = ProducerCore(ProducerConfig.from_dict(base))
        self.now = 0
        self.models: dict[TopicPartition, ModelPartition] = {}
        self.in_flight: list[Request] = []
        self.results: dict = {}   # cookie -> (offset or None, error)
        self.next_cookie = 0
        self.max_window_seen: dict[TopicPartition, int] = {}
        self.next_pid = 1000
        for name, model in partitions.items():
            topic, _, p = name.rpartition("_")
            self.add_partition(TopicPartition(topic, int(p)), model)

    def add_partition(self, tp: TopicPartition, model: ModelPartition, node: int = 1) -> None:
        self.models[tp] = model
        self.core.update_leader(tp, node, 0)

    def init_pid(self) -> None:
        req = self.core.producer_id_request()
        if req is None:
            return
        pid, epoch = req
        if pid < 0:
            self.next_pid += 1
            self.core.on_producer_id(self.next_pid, 0)
        else:
            self.core.on_producer_id(pid, epoch + 1)

    def produce(self, tp: TopicPartition, n: int = 1) -> list[int]:
        cookies = []
        for _ in range(n):
            c = self.next_cookie
            self.next_cookie += 1
            assert self.core.append(tp, self.now, None, b"v%d" % c, None, c, self.now) is not None
            cookies.append(c)
        return cookies

    def send(self, node: int = 1) -> list[Request]:
        """One pass of the sender as the asyncio shell runs it: producer id, expiry, drain."""
        self.init_pid()
        self.core.expire(self.now)
        self.collect()
        out = []
        while True:
            batches = self.core.drain(node, self.now)
            if not batches:
                break
            for b in batches:
                ps = self.core.partition_state(b.tp)
                if not getattr(ps, "range_mode", ps.max_inflight_sequences is not None):
                    assert ps.in_flight <= ps.window, f"{b.tp}: {ps.in_flight} above window {ps.window}"
                if ps.max_inflight_sequences is not None:
                    assert ps.unacked_records <= ps.max_inflight_sequences
            r = Request(node, batches)
            out.append(r)
            self.in_flight.append(r)
        if self.core.node_in_flight.get(node, 0) > self.core.config.max_in_flight:
            raise AssertionError("per-connection limit exceeded")
        return out

    def process(self, req: Request, name_leader: bool = False, refuse: dict | None = None) -> None:
        """The broker handles the request (in arrival order); its answer is not delivered yet.
        A partition whose model names another leader is refused with NOT_LEADER_OR_FOLLOWER
        (naming the leader, KIP-951, if `name_leader`); `refuse`: tp -> error code, a refusal
        before anything is appended."""
        out = []
        for tp, pid, epoch, seq, cookies in req.sent:
            m = self.models[tp]
            if refuse and tp in refuse:
                out.append(PartitionResult(error_code=refuse[tp], log_start_offset=m.log_start))
            elif m.leader is not None and m.leader != req.node:
                r = PartitionResult(error_code=E.NOT_LEADER_OR_FOLLOWER, log_start_offset=m.log_start)
                if name_leader:
                    r.current_leader = (m.leader, m.leader_epoch)
                out.append(r)
            else:
                out.append(m.append(pid, epoch, seq, cookies))
        req.results = out

    def error(self, req: Request, code: int, current_leader: tuple[int, int] | None = None) -> None:
        """The broker refuses the whole request without appending (e.g. NOT_LEADER_OR_FOLLOWER,
        naming the new leader as KIP-951's CurrentLeader)."""
        extra = {} if current_leader is None else {"current_leader": current_leader}
        req.results = [PartitionResult(error_code=code, log_start_offset=self.models[b.tp].log_start,
                                       **extra)
                       for b in req.batches]

    def deliver(self, req: Request) -> None:
        assert req.results is not None
        self.in_flight.remove(req)
        self.core.on_response(req.node, list(zip(req.batches, req.results)), self.now)
        self.collect()

    def lose(self, req: Request) -> None:
        """Connection dropped: processed or not, the client sees no answer."""
        self.in_flight.remove(req)
        self.core.on_request_failed(req.node, req.batches, self.now)
        self.collect()

    def roundtrip(self, node: int = 1) -> int:
        reqs = self.send(node)
        pending = list(self.in_flight)
        for r in pending:
            if r.results is None:
                self.process(r)
        for r in pending:
            self.deliver(r)
        return len(reqs)

    def run_until_idle(self, limit: int = 1000) -> None:
        for _ in range(limit):
            if not self.core.has_pending() and not self.in_flight:
                return
            self.now += 1
            if not self.roundtrip() and not self.in_flight:
                if not self.core.acc.has_unsent():
                    return
        raise AssertionError("producer did not settle")

    def collect(self) -> None:
        for c in self.core.take_completions():
            for i, cookie in enumerate(c.batch.cookies):
                off = None if c.base_offset is None or c.error else c.base_offset + i
                assert cookie not in self.results, \
                    f"record {cookie} completed twice: {self.results[cookie]}, then {(off, c.error)}"
                self.results[cookie] = (off, c.error)
