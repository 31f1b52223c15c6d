"""The late-endtxn fault: an EndTxn that arrives after its producer has moved on (Jepsen's
Bufstream analysis, KAFKA-17754).

A proxy that sees a client send EndTxn may hold it: the request does not reach the broker, and
the client's connection hangs (nothing more of it is forwarded) until `hold_s`, longer than the
client's request timeout, has passed; then it is closed. The client has timed the request out and
sent it again on another connection, so its transaction ends as it asked, and it begins the next
one. When the first transactional Produce of that producer (same transactional id, on any proxy
of the cluster) has been written, and before its answer reaches the client, the held EndTxn is
delivered to the broker it was meant for on a connection of its own, and its answer goes nowhere.

Under Transactions V1 the producer epoch stays the same from one transaction to the next, so the
coordinator takes the late EndTxn for one of the transaction now open: a late COMMIT commits what
the new transaction wrote so far, a late ABORT aborts it. Under V2 every EndTxn bumps the epoch and
the late one is fenced. A held EndTxn whose producer never produces again is delivered after
`give_up_s`.

The proxies of one cluster share one LateEndTxn (they run on threads of their own): the EndTxn
reaches the coordinator's proxy, the Produce the partition leader's.
"""
from __future__ import annotations

import asyncio
import random
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass

from oncelog.protocol.api import ApiKey, is_flexible
from oncelog.protocol.errors import error_code
from oncelog.protocol.headers import read_request_header, response_header_size
from oncelog.protocol.primitives import Reader


@dataclass(eq=False)
class Held:
    transactional_id: str
    frame: bytes                  # the EndTxn request, its size included
    upstream: tuple[str, int]     # the broker it was meant for
    since: float
    committed: bool


def transactional_id(frame: bytes, api_key: int) -> str | None:
    """The transactional id of an EndTxn or a Produce request (None: a Produce outside
    transactions, a version without one, or a frame that does not parse)."""
    try:
        body = memoryview(frame)[4:]
        header = read_request_header(body)
        if api_key == ApiKey.PRODUCE and header.api_version < 3:
            return None
        return Reader(body, header.body_offset).string(compact=is_flexible(api_key, header.api_version))
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None


def _end_txn_committed(frame: bytes) -> bool:
    """EndTxn's `committed` flag: its last field before the tagged fields."""
    body = memoryview(frame)[4:]
    header = read_request_header(body)
    flexible = is_flexible(ApiKey.END_TXN, header.api_version)
    r = Reader(body, header.body_offset)
    r.string(compact=flexible)
    r.i64()
    r.i16()
    return r.boolean()


class LateEndTxn:
    def __init__(self, probability: float, hold_s: float, seed: int = 0, give_up_s: float = 60) -> None:
        self.probability, self.hold_s, self.give_up_s = probability, hold_s, give_up_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.held: dict[str, Held] = {}
        self.stats: Counter[str] = Counter()
        self._deliveries: set[asyncio.Task] = set()

    def hold(self, frame: bytes, upstream: tuple[str, int]) -> Held | None:
        """For an EndTxn a proxy is about to forward: held (the caller forwards nothing more of
        that connection) or None (forward it)."""
        tid = transactional_id(frame, ApiKey.END_TXN)
        if tid is None:
            return None
        with self.lock:
            if tid in self.held or self.rng.random() >= self.probability:
                return None
            try:
                held = self.held[tid] = Held(tid, frame, upstream, time.monotonic(), _end_txn_committed(frame))
            except (struct.error, ValueError, IndexError):
                return None
            self.stats[f"EndTxn({'COMMIT' if held.committed else 'ABORT'}) held"] += 1
        asyncio.get_running_loop().call_later(self.give_up_s, self._give_up, held)
        return held

    def due(self, frame: bytes) -> Held | None:
        """For a Produce a proxy forwards: the EndTxn held for its producer, which has begun its
        next transaction (deliver it once the Produce is written)."""
        if not self.held:   # the common case, without parsing
            return None
        tid = transactional_id(frame, ApiKey.PRODUCE)
        if tid is None:
            return None
        with self.lock:
            return self.held.pop(tid, None)

    def put_back(self, held: Held) -> None:
        """The Produce that was to deliver it got no answer (its connection closed): the next
        Produce of its producer delivers it, or the time limit."""
        with self.lock:
            self.held.setdefault(held.transactional_id, held)

    async def deliver(self, held: Held, when: str) -> None:
        """The held EndTxn to the broker it was meant for, on a connection of its own; waits for
        the answer, which is counted and dropped."""
        self.stats[f"delivered {when}"] += 1
        try:
            reader, writer = await asyncio.open_connection(*held.upstream)
        except OSError:
            self.stats["not delivered: its broker was down"] += 1
            return
        try:
            writer.write(held.frame)
            size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 30))[0]
            answer = await asyncio.wait_for(reader.readexactly(size), 30)
            version = read_request_header(memoryview(held.frame)[4:]).api_version
            at = response_header_size(ApiKey.END_TXN, version, answer) + 4  # past throttle_time_ms
            code = struct.unpack_from(">h", answer, at)[0]
            self.stats[f"late EndTxn({'COMMIT' if held.committed else 'ABORT'}) answered "
                       f"{error_code(code).name}"] += 1
        except (OSError, asyncio.IncompleteReadError, TimeoutError, struct.error, IndexError, ValueError):
            self.stats["late EndTxn: no answer"] += 1
        finally:
            writer.close()

    def _give_up(self, held: Held) -> None:
        with self.lock:
            if self.held.get(held.transactional_id) is not held:
                return
            del self.held[held.transactional_id]
        task = asyncio.ensure_future(self.deliver(held, f"without a next transaction, after {self.give_up_s:.0f} s"))
        self._deliveries.add(task)   # kept until done (the loop holds tasks weakly)
        task.add_done_callback(self._deliveries.discard)
