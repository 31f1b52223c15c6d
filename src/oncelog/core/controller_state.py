"""Producer-id blocks (KIP-730) and broker registrations: the controller's decisions.

Kafka's split: `decide_*` validates and returns (records, reply) without changing anything; the
controller appends the records to its metadata log, fsyncs, and only then calls `replay` (the only
state change) and sends the reply. So a reply always describes durable state, and the state after
a restart is exactly what the log replays to.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
MAX_ID = 2**63 - 1
PID_BLOCK, BROKER = "pid_block", "broker"


class ProducerIdsBlock(NamedTuple):
    broker_id: int
    first: int
    size: int

    @property
    def last(self) -> int:
        return self.first + self.size - 1

    @property
    def next_first(self) -> int:
        return self.first + self.size


EMPTY_BLOCK = ProducerIdsBlock(-1, 0, 0)


@dataclass
class BrokerRegistration:
    broker_id: int
    epoch: int
    host: str
    port: int


@dataclass
class ControllerState:
    """Everything the metadata log holds about producer ids and brokers."""
    next_producer_id: int = 0
    latest_block: ProducerIdsBlock = EMPTY_BLOCK
    brokers: dict[int, BrokerRegistration] = field(default_factory=dict)
    last_broker_epoch: int = 0

    # ------------------------------------------------------------------ decisions
    def decide_register(self, broker_id: int, host: str, port: int) -> tuple[list[dict[str, Any]], int]:
        """A (re)registration gets a new, higher broker epoch: older sessions become stale."""
        epoch = self.last_broker_epoch + 1
        return [{"type": BROKER, "broker_id": broker_id, "epoch": epoch, "host": host, "port": port}], epoch

    def check_broker_epoch(self, broker_id: int, epoch: int) -> None:
        reg = self.brokers.get(broker_id)
        if reg is None:
            raise KafkaProtocolError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} is not registered")
        if reg.epoch != epoch:
            raise KafkaProtocolError(ErrorCode.STALE_BROKER_EPOCH,
                                     f"broker {broker_id} epoch {epoch} is stale (current {reg.epoch})")

    def decide_allocate(self, broker_id: int, broker_epoch: int) -> tuple[list[dict[str, Any]], ProducerIdsBlock]:
        self.check_broker_epoch(broker_id, broker_epoch)
        first = self.next_producer_id
        if first > MAX_ID - BLOCK_SIZE:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_SERVER_ERROR, "producer ids exhausted")
        block = ProducerIdsBlock(broker_id, first, BLOCK_SIZE)
        return [{"type": PID_BLOCK, "broker_id": broker_id, "broker_epoch": broker_epoch,
                 "next_producer_id": block.next_first}], block

    def decide_floor(self, floor: int) -> list[dict[str, Any]]:
        """KIP-730's upgrade rule: continue strictly above ids an earlier allocator issued."""
        if floor <= self.next_producer_id:
            return []
        return [{"type": PID_BLOCK, "broker_id": -1, "broker_epoch": -1, "next_producer_id": floor}]

    # ------------------------------------------------------------------ the only state change
    def replay(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == PID_BLOCK:
            nxt = record["next_producer_id"]
            if nxt <= self.next_producer_id:
                raise ValueError(f"producer-id block must increase: next {nxt} <= {self.next_producer_id}")
            first = nxt - BLOCK_SIZE if record["broker_id"] >= 0 else nxt
            self.latest_block = ProducerIdsBlock(record["broker_id"], max(first, self.next_producer_id),
                                                 nxt - max(first, self.next_producer_id))
            self.next_producer_id = nxt
        elif kind == BROKER:
            self.brokers[record["broker_id"]] = BrokerRegistration(record["broker_id"], record["epoch"],
                                                                   record["host"], record["port"])
            self.last_broker_epoch = max(self.last_broker_epoch, record["epoch"])
        else:
            raise ValueError(f"unknown record type {kind!r}")

    # ------------------------------------------------------------------ snapshots
    def to_snapshot(self) -> dict[str, Any]:
        return {"next_producer_id": self.next_producer_id, "latest_block": list(self.latest_block),
                "last_broker_epoch": self.last_broker_epoch,
                "brokers": [vars(b) for b in self.brokers.values()]}

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> ControllerState:
        s = cls(data["next_producer_id"], ProducerIdsBlock(*data["latest_block"]),
                last_broker_epoch=data["last_broker_epoch"])
        s.brokers = {b["broker_id"]: BrokerRegistration(**b) for b in data["brokers"]}
        return s


class TokenBucket:
    """Rate limit per caller (time passed in): `take(now_ms)` returns the throttle time in ms."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate, self.burst = rate_per_s, burst
        self._tokens: dict[Any, tuple[float, int]] = {}

    def take(self, key: Any, now_ms: int) -> int:
        tokens, last = self._tokens.get(key, (float(self.burst), now_ms))
        tokens = min(self.burst, tokens + (now_ms - last) * self.rate / 1000)
        if tokens >= 1:
            self._tokens[key] = (tokens - 1, now_ms)
            return 0
        self._tokens[key] = (tokens, now_ms)
        return int((1 - tokens) * 1000 / self.rate) + 1
