"""An answer that is not ready when its handler returns: an acks=all Produce that has appended
everything and waits only for its fsync.

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

from collections.abc import Callable
from typing import Any


class Later:
    """Resolved once, with a value or an exception; each callback runs when it is (at once if
    it already is), with the Later itself. A callback must not raise: the resolver does not
    expect it (the group commit would stop settling the other waiters)."""

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
            callback(self)
        else:
            self._callbacks.append(callback)

    def then(self, step: Callable[[Any], Any]) -> Later:
        """A Later of `step(value)`, failed with what this one failed with or what `step` raises."""
        out = Later()

        def go(done: Later) -> None:
            try:
                out.resolve(step(done.result()))
            except Exception as e:  # noqa: BLE001 - handed on to whoever reads the result
                out.fail(e)
        self.on_done(go)
        return out

    def _settle(self, value: Any, error: BaseException | None) -> None:
        if self.done:
            return
        self.done, self._value, self._error = True, value, error
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback(self)
