"""A broker's copy of the controller's security records (ACLs, client quotas, and the dynamic
broker configs that travel with them: `broker.dynamic_config`), kept current by
polling the controller's feed (`controller.security`) every heartbeat interval and replayed
through the same `SecurityMetadata.replay` the controller uses, so every broker of a cluster
enforces a prefix of the controller's state. A broker that forwarded a change calls `catch_up`
before it answers, so its client sees its own change at once."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from oncelog.broker.cluster.controller_client import ControllerClient, ControllerUnavailable
from oncelog.core.security.metadata import SecurityMetadata
from oncelog.protocol.api import SECURITY_RECORDS_KEY
from oncelog.protocol.errors import KafkaProtocolError

log = logging.getLogger(__name__)


class SecurityFollower:
    def __init__(self, client: ControllerClient, interval_ms: int) -> None:
        self.client = client
        self.interval_s = interval_ms / 1000
        self.state = SecurityMetadata()
        self.offset = -1                 # the controller's log offset this copy is complete up to
        # run after a change was applied (a snapshot replaces `state`: holders of its parts re-read them)
        self.on_change: list[Callable[[SecurityMetadata], None]] = []
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def catch_up(self) -> None:
        async with self._lock:
            body = json.dumps({"after": self.offset}).encode()
            answer = json.loads(await self.client.raw(SECURITY_RECORDS_KEY, 0, body))
            changed = False
            if "snapshot" in answer:
                self.state = SecurityMetadata.from_snapshot(answer["snapshot"])
                changed = True
            for record in answer.get("records", ()):
                self.state.replay(record)
                changed = True
            self.offset = int(answer["end"])
            if changed:
                for callback in self.on_change:
                    callback(self.state)

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.catch_up()
            except (ControllerUnavailable, KafkaProtocolError) as e:
                log.warning("security records: controller not reachable (%s); keeping what was applied", e)
            except ValueError as e:
                log.error("security records from the controller do not replay (%s); keeping what was applied", e)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.client.close()
