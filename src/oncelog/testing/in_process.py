"""A single node in the test's own process and event loop: the broker and the controller that
`oncelog serve` runs with it. For tests that reach into the broker (its clock, its partitions, a
handler); everything else runs a real `oncelog serve` (`testing.embedded.BrokerProcess`)."""
from __future__ import annotations

import time
from collections.abc import Callable

from oncelog.broker.config import BrokerConfig
from oncelog.broker.net.server import Broker
from oncelog.controller.connection_limits import ConnectionLimits
from oncelog.controller.embedded import start_in_process
from oncelog.controller.service import Controller


class InProcessBroker(Broker):
    """A Broker that starts its own in-process controller unless `config` names one, and stops
    it after itself. `config` is copied: a restart from the same config starts a new controller."""

    def __init__(self, config: BrokerConfig, clock: Callable[[], float] = time.time) -> None:
        super().__init__(BrokerConfig(dict(config.items())), clock)
        self._embedded = not self.config["controller.quorum.bootstrap.servers"]
        self.controller: Controller | None = None

    async def start(self) -> tuple[str, int]:
        if self._embedded and self.controller is None:
            self.controller, reach = await start_in_process(self.config.log_dirs[0],
                                                            limits=ConnectionLimits.from_settings(self.config.get))
            self.config.update(reach)
        return await super().start()

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            if self.controller is not None:
                await self.controller.stop()
                self.controller = None
