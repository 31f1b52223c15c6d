"""A cheaper concurrent.futures.Future for per-record delivery results.

The standard Future builds a Condition (and its RLock) per instance and takes it on completion;
at tens of thousands of records per second that is most of a send's cost. Here the Condition is
created only if someone actually blocks on this future; state changes go through one module lock
(held for a few attribute writes). It stays a real `concurrent.futures.Future` subclass, so
`result()`, `exception()`, `add_done_callback()`, `concurrent.futures.wait/as_completed` work.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, LOGGER, PENDING
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import Any

_LOCK = threading.Lock()


class RecordFuture(Future):
    # defaults live on the class: creating one sets nothing (a send creates one per record)
    _state = PENDING
    _result = None
    _exception = None
    _done_callbacks: list | tuple = ()
    _cond = None
    _on_delivery: Callable[..., Any] | None = None   # the producer's delivery callback for this record, if any

    def __init__(self) -> None:  # noqa: D107 - deliberately not calling Future.__init__
        pass

    @property  # made on first use, not in __init__
    def _waiters(self) -> list:  # type: ignore[override]
        """concurrent.futures.wait/as_completed register here (under `_condition`)."""
        w = self.__dict__.get("_waiter_list")
        if w is None:
            w = self.__dict__["_waiter_list"] = []
        return w

    @property  # made on first use, not in __init__
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        c = self._cond
        if c is None:
            with _LOCK:
                c = self._cond
                if c is None:
                    c = self._cond = threading.Condition()
        return c

    def set_result(self, result) -> None:
        complete_all([self], [result], None)

    def set_exception(self, exception) -> None:
        complete_all([self], [None], exception)

    def add_done_callback(self, fn) -> None:
        with _LOCK:
            if self._state == PENDING:
                if not self._done_callbacks:
                    self._done_callbacks = []
                self._done_callbacks.append(fn)  # type: ignore[union-attr]  # a list from here on
                return
        try:
            fn(self)
        except Exception:  # noqa: BLE001
            LOGGER.exception("exception calling callback for %r", self)

    def cancel(self) -> bool:
        """A record handed to the producer cannot be taken back."""
        with _LOCK:
            return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED)

    def done(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


def complete_all(futures: list, results: list | None, exception: BaseException | None) -> None:
    """Complete many RecordFutures (one batch's worth) under one acquisition of the module lock.
    Attributes are set by C-level iteration; only futures that someone waits on or that have
    done-callbacks are visited one by one."""
    n = len(futures)
    if results is None:
        results = [None] * n
    with _LOCK:
        if list(map(_state_of, futures)).count(PENDING) != n:
            # some are done already (a batch failed at close, then answered): skip those
            keep = [i for i, f in enumerate(futures) if f._state == PENDING]
            futures = [futures[i] for i in keep]
            results = [results[i] for i in keep]
            n = len(futures)
        _drain(map(setattr, futures, repeat("_result", n), results))
        if exception is not None:
            _drain(map(setattr, futures, repeat("_exception", n), repeat(exception, n)))
        _drain(map(setattr, futures, repeat("_state", n), repeat(FINISHED, n)))
        woken = list(filter(_cond_of, futures))
        callbacks = [(f, f._done_callbacks) for f in filter(_callbacks_of, futures)]
        for f, _cbs in callbacks:
            f._done_callbacks = ()
    for f in woken:
        with f._cond:
            for w in f._waiters:
                if exception is None:
                    w.add_result(f)
                else:
                    w.add_exception(f)
            f._cond.notify_all()
    for f, cbs in callbacks:
        for cb in cbs:
            try:
                cb(f)
            except Exception:  # noqa: BLE001
                LOGGER.exception("exception calling callback for %r", f)


_state_of = attrgetter("_state")
_cond_of = attrgetter("_cond")
_callbacks_of = attrgetter("_done_callbacks")
_drain: Callable[[Iterable[Any]], None] = deque(maxlen=0).extend   # runs an iterator to its end


# A send creates one future per record: this skips even the empty __init__'s Python frame
# (every attribute has its default on the class).
new_record_future = partial(object.__new__, RecordFuture)
