"""Registration with the controller and heartbeats: they give the broker its epoch, which every
AllocateProducerIds carries (a stale epoch is refused) and which keeps it counted as alive."""
from __future__ import annotations

import asyncio
import logging

from oncelog.broker.cluster.controller_client import ControllerClient, ControllerUnavailable
from oncelog.broker.cluster.producer_id_manager import MAX_BACKOFF_MS
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)


class ControllerLink:
    def __init__(self, client: ControllerClient, broker_id: int, cluster_id: str, host: str, port: int,
                 heartbeat_interval_ms: int = 500, listener: str = "PLAINTEXT", security_protocol: int = 0) -> None:
        self.client = client
        # the first listener, registered with Kafka's protocol id (what other brokers' Metadata lists)
        self.listener, self.security_protocol = listener, security_protocol
        self.broker_id, self.cluster_id = broker_id, cluster_id
        self.host, self.port = host, port
        self.interval_s = heartbeat_interval_ms / 1000
        self.epoch = -1
        self._task: asyncio.Task | None = None

    async def register(self, attempts: int = 100) -> int:
        delay = 0.05
        for i in range(attempts):
            try:
                r = await self.client.request(
                    ApiKey.BROKER_REGISTRATION, 1, broker_id=self.broker_id, cluster_id=self.cluster_id,
                    incarnation_id=None, listeners=(self._listener(),), features=(), rack=None,
                    is_migrating_zk_broker=False)
            except ControllerUnavailable as e:
                if i == attempts - 1:
                    raise
                log.info("controller not reachable yet (%s); retrying", e)
                await asyncio.sleep(delay)
                delay = min(MAX_BACKOFF_MS / 1000, delay * 2)
                continue
            if int(r.error_code) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                raise KafkaProtocolError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                         "the controller refused this broker's credentials (no cluster rights)")
            if int(r.error_code):
                raise KafkaProtocolError(ErrorCode(int(r.error_code)), "broker registration")
            self.epoch = int(r.broker_epoch)
            log.info("registered with the controller as broker %d, epoch %d", self.broker_id, self.epoch)
            return self.epoch
        raise ControllerUnavailable("broker registration did not succeed")

    def _listener(self):
        from oncelog.protocol import entities
        cls = entities.nested(ApiKey.BROKER_REGISTRATION, 1, "request", "Listener")
        return entities.make(cls, name=self.listener, host=self.host, port=self.port,
                             security_protocol=self.security_protocol)

    def start(self) -> None:
        self._task = asyncio.create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                r = await self.client.request(ApiKey.BROKER_HEARTBEAT, 0, broker_id=self.broker_id,
                                              broker_epoch=self.epoch, current_metadata_offset=0,
                                              want_fence=False, want_shut_down=False)
                if int(r.error_code) in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
                    log.warning("controller says epoch %d is stale: registering again", self.epoch)
                    await self.register()
            except ControllerUnavailable as e:
                log.warning("heartbeat failed: %s", e)
            except KafkaProtocolError as e:
                log.warning("heartbeat: %s", e)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.client.close()
