"""Producer ids from the controller's KIP-730 blocks, as Kafka's RPCProducerIdManager hands them out.

Ids come from the current block; when 90% of it is used the next block is requested in the
background, so in steady state no InitProducerId waits on the controller. Only when the current
block is exhausted and no next block has arrived does a caller get COORDINATOR_LOAD_IN_PROGRESS
(retriable: clients retry). Errors back off exponentially; CLUSTER_AUTHORIZATION_FAILED means the
broker's credentials lack cluster rights, which no retry fixes: the broker is told to stop.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from oncelog.broker.cluster.controller_client import ControllerClient, ControllerUnavailable
from oncelog.core.controller_state import EMPTY_BLOCK, ProducerIdsBlock
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)

PREFETCH_AT = 0.90
RETRY_BACKOFF_MS = 50
MAX_BACKOFF_MS = 2000


class FatalControllerError(RuntimeError):
    """The controller refuses this broker for good (no cluster rights)."""


class ProducerIdManager:
    def __init__(self, client: ControllerClient, broker_id: int, broker_epoch: Callable[[], int],
                 on_fatal: Callable[[str], None] | None = None, prefetch: bool = True) -> None:
        self.client = client
        self.broker_id = broker_id
        self._epoch = broker_epoch
        self._on_fatal = on_fatal
        self.prefetch = prefetch
        self.current = EMPTY_BLOCK
        self._next_id = 0
        self.next_block: ProducerIdsBlock | None = None
        self._inflight: asyncio.Task | None = None
        self._backoff_ms = 0
        self._backoff_until = 0.0
        self.fatal: str | None = None
        self.blocks_received = 0

    async def generate_producer_id(self) -> int:
        for _ in range(3):
            try:
                return self.producer_id_nowait()
            except KafkaProtocolError as e:
                if e.code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS or self._inflight is None:
                    raise
            # Nothing left: wait briefly for the block on its way rather than fail at once.
            try:
                await asyncio.wait_for(asyncio.shield(self._inflight), 0.5)
            except TimeoutError:
                break
        raise KafkaProtocolError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "waiting for a producer-id block")

    def producer_id_nowait(self) -> int:
        """A producer id from the blocks at hand, without waiting (the transaction coordinator's
        decisions are synchronous: `core.txn.TransactionCoordinator` calls this mid-decision).
        With none at hand it asks for a block and raises COORDINATOR_LOAD_IN_PROGRESS, which
        clients retry, as Kafka's coordinator answers while its manager waits for a block."""
        if self.fatal:
            raise KafkaProtocolError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, self.fatal)
        if not (self.current.size and self._next_id <= self.current.last) and self.next_block is not None:
            self.current, self.next_block = self.next_block, None
            self._next_id = self.current.first
        if self.current.size and self._next_id <= self.current.last:
            pid = self._next_id
            self._next_id += 1
            if self.prefetch and pid == self.current.first + int(self.current.size * PREFETCH_AT):
                self._request_next_block()
            return pid
        self._request_next_block()
        raise KafkaProtocolError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "waiting for a producer-id block")

    def _request_next_block(self) -> None:
        loop = asyncio.get_running_loop()
        if self.next_block is not None or self._inflight is not None or loop.time() < self._backoff_until:
            return
        self._inflight = asyncio.ensure_future(self._fetch_block())
        self._inflight.add_done_callback(lambda _t: setattr(self, "_inflight", None))

    async def _fetch_block(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            r = await self.client.request(ApiKey.ALLOCATE_PRODUCER_IDS, 0, broker_id=self.broker_id,
                                          broker_epoch=self._epoch())
            code = int(r.error_code)
            if code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                self._fatal("the controller refused AllocateProducerIds: this broker's principal has no "
                            "cluster rights (CLUSTER_AUTHORIZATION_FAILED); fix controller credentials")
                return
            if code != 0:
                raise KafkaProtocolError(ErrorCode(code), "AllocateProducerIds")
            block = ProducerIdsBlock(self.broker_id, int(r.producer_id_start), int(r.producer_id_len))
            if block.first <= self.current.last or block.size <= 0:
                raise KafkaProtocolError(ErrorCode.UNKNOWN_SERVER_ERROR,
                                         f"block {block} does not follow {self.current}")
            self.next_block = block
            self.blocks_received += 1
            self._backoff_ms = 0
        except (KafkaProtocolError, ControllerUnavailable) as e:
            self._backoff_ms = min(MAX_BACKOFF_MS, max(RETRY_BACKOFF_MS, self._backoff_ms * 2))
            self._backoff_until = loop.time() + self._backoff_ms / 1000
            log.warning("producer-id block request failed (%s); retrying after %d ms", e, self._backoff_ms)

    def _fatal(self, message: str) -> None:
        self.fatal = message
        log.critical(message)
        if self._on_fatal is not None:
            self._on_fatal(message)


async def retrying(call: Callable[[], Awaitable], attempts: int = 50, backoff_ms: int = 50):
    """Retry a controller call through ControllerUnavailable and retriable errors, with backoff."""
    delay = backoff_ms
    for i in range(attempts):
        try:
            return await call()
        except ControllerUnavailable:
            if i == attempts - 1:
                raise
        await asyncio.sleep(delay / 1000)
        delay = min(MAX_BACKOFF_MS, delay * 2)
