"""Client quotas on the broker (KIP-13, KIP-124, KIP-219; docs/security.md §6).

The quota settings are the ones the broker follows from the controller (`SecurityFollower`);
`core.security.quotas.ClientQuotaManager` does the arithmetic with the broker's clock. The user
is the principal's name (`ANONYMOUS` on PLAINTEXT), the client id the request header's.

KIP-219: a handler answers at once with `throttle_time_ms` and calls `throttle(ms)`, which mutes
the connection the request came on (`request_context.MUTE`, set by the connection) for that long:
the client reads the answer, backs off, and cannot send more meanwhile. A throttled Produce is
appended; a throttled Fetch returns no records and its bytes are taken back (Kafka's
`unrecordQuotaSensor`).
"""
from __future__ import annotations

import time
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from oncelog.broker.config import BrokerConfig
from oncelog.broker.net.request_context import CLIENT, MUTE, PRINCIPAL
from oncelog.core.security.metadata import SecurityMetadata
from oncelog.core.security.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuotaManager,
    ClientQuotaStore,
    request_percentage,
)

_Answer = TypeVar("_Answer")  # whatever the handler answers


class BrokerQuotas:
    def __init__(self, config: BrokerConfig, now_ms: Callable[[], int]) -> None:
        samples, window_s = config["quota.window.num"], config["quota.window.size.seconds"]
        self.now_ms = now_ms
        store = ClientQuotaStore()
        self.produce = ClientQuotaManager(store.overrides(PRODUCER_BYTE_RATE), samples, window_s)
        self.fetch = ClientQuotaManager(store.overrides(CONSUMER_BYTE_RATE), samples, window_s)
        self.request = ClientQuotaManager(store.overrides(REQUEST_PERCENTAGE), samples, window_s,
                                          max_throttle_ms=window_s * 1000)

    def follow(self, state: SecurityMetadata) -> None:
        """Read the followed settings (a snapshot from the controller replaces the store)."""
        self.produce.overrides = state.quotas.overrides(PRODUCER_BYTE_RATE)
        self.fetch.overrides = state.quotas.overrides(CONSUMER_BYTE_RATE)
        self.request.overrides = state.quotas.overrides(REQUEST_PERCENTAGE)

    @staticmethod
    def _who() -> tuple[str, str]:
        return PRINCIPAL.get().name, CLIENT.get()[0] or ""

    def record_produce(self, nbytes: int) -> int:
        if not self.produce.overrides:
            return 0
        return self.produce.record(*self._who(), nbytes, self.now_ms())

    def record_fetch(self, nbytes: int) -> int:
        if not self.fetch.overrides:
            return 0
        return self.fetch.record(*self._who(), nbytes, self.now_ms())

    def fetch_window_bytes(self) -> int:
        """The most a Fetch may ask for: what the caller's quota allows in its window."""
        if not self.fetch.overrides:
            return 2**31 - 1
        return int(min(self.fetch.max_value_in_window(*self._who()), 2**31 - 1))

    def unrecord_fetch(self, nbytes: int) -> None:
        self.fetch.unrecord(*self._who(), nbytes, self.now_ms())

    def record_request_time(self, thread_time_ns: int) -> int:
        if not self.request.overrides:
            return 0
        return self.request.record(*self._who(), request_percentage(thread_time_ns), self.now_ms())

    async def handle_timed(self, handling: Awaitable[_Answer]) -> _Answer:
        """Run a handler, counting the event loop's time in its steps (not the time it waits) against
        the caller's `request_percentage`; over the quota the connection is muted (KIP-219). The
        answer's throttle_time_ms shows byte-rate throttles only: the time is known once the
        answer is made. The caller skips it while no request quota is set."""
        spent = [0]
        try:
            return await _timed(handling, spent)
        finally:
            throttle(self.record_request_time(spent[0]))


def throttle(ms: int) -> None:
    """Mute the current request's connection for `ms` after its answer (KIP-219)."""
    if ms > 0:
        mute = MUTE.get()
        if mute is not None:
            mute(ms)


@types.coroutine
def _timed(coro: Any, spent: list[int]) -> Generator[Any, Any, Any]:
    """Drive `coro` as `await` would, adding the time of each of its steps to spent[0]."""
    send: Any = None
    error: BaseException | None = None
    while True:
        started = time.perf_counter_ns()
        try:
            waiting_on = coro.send(send) if error is None else coro.throw(error)
        except StopIteration as done:
            return done.value
        finally:
            spent[0] += time.perf_counter_ns() - started
        try:
            send, error = (yield waiting_on), None
        except BaseException as e:  # noqa: BLE001 - handed to the coroutine, which re-raises what it does not handle
            send, error = None, e
