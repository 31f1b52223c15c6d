"""An answer that is not ready when its handler returns: an acks=all Produce that has appended
everything and waits only for its fsync.

The callbacks run where the Later is resolved (the group commit's completion, or another
request's handling): not in the request's own context, so they must not read its context
variables (`request_context`). With request quotas, the request's time is counted until it returns
its Later: the answer's encoding after the fsync is not (byte-rate quotas count the records
before, as ever).

Why not a task or an asyncio future: each step through one of those is a trip through the event
loop (a future runs its callbacks on the next pass), and a lone durable Produce took four of them
between its fsync's end and its answer's write (the fsync's future, the request's timeout gate,
the request's task, the connection's outbox callback): about 40 microseconds of a 0.45 ms request
on a 2-core machine (issue 38). A `Later` runs its callbacks as it is resolved, so the group
commit's completion writes the answer in the same pass.

A handler that returns a Later has finished everything but the answer: the connection lets the
Produce requests behind it start (their appends join the same fsync), as Kafka's delayed produce
does not hold up the channel's next Produce, and sends the answers in request order.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Later:
    """Resolved once, with a value or an exception; each callback runs when it is (at once if
    it already is), with the Later itself. A callback that raises is logged and the others
    still run: the resolver (the group commit settling its waiters) must not be stopped by it."""

    __slots__ = ("done", "_value", "_error", "_callbacks")

    def __init__(self) -> None:
        self.done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Later], None]] | None = []

    def resolve(self, value: Any) -> None:
        self._settle(value, None)

    def fail(self, error: BaseException) -> None:
        self._settle(None, error)

    def result(self) -> Any:
        """The value, or raises the exception it was resolved with."""
        assert self.done, "a Later's result before it was resolved"
        if self._error is not None:
            raise self._error
        return self._value

    def on_done(self, callback: Callable[[Later], None]) -> None:
        if self._callbacks is None:
            _run(callback, self)
        else:
            self._callbacks.append(callback)

    def _settle(self, value: Any, error: BaseException | None) -> None:
        if self.done:
            return
        self.done, self._value, self._error = True, value, error
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            _run(callback, self)


def _run(callback: Callable[[Later], None], later: Later) -> None:
    try:
        callback(later)
    except Exception:  # noqa: BLE001 - see Later: logged, the other callbacks still run
        log.exception("a callback of a Later answer failed")
