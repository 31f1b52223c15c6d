"""Delivery: reports each completed batch's outcome to its records' futures and callbacks, and
wakes whoever waits for batches to complete (flushes, senders blocked on buffer.memory).

A record's *cookie* says how its outcome is reported: a RecordFuture (the sync facade's `send`;
its callback, if any, rides on it as `_on_delivery`), a DeliveryCallback (`produce`: a callback
only), or an (asyncio future, callback) pair (AIOProducer.send). One object per record, none per
field: the cyclic collector tracks every object that lives until delivery, and with one per
record it was a quarter of the run less (docs/benchmarks.md).

Delivery is most of the sender thread's per-record work, so a batch whose cookies are all of one
kind is reported in bulk: its RecordMetadata built, its futures completed (one lock per batch,
`futures.complete_all`) and a callback shared by the batch called by C-level iteration (`map`,
`repeat`, a zero-length deque draining the iterator) instead of a Python loop per record. Mixed
batches and asyncio sends take the plain loop."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import Any, NamedTuple

from oncelog.client.futures import RecordFuture, complete_all
from oncelog.client.types import RecordMetadata, SentBatch

log = logging.getLogger("oncelog.client.producer")

_new_metadata = partial(tuple.__new__, RecordMetadata)   # skips NamedTuple's Python __new__
_on_delivery_of = attrgetter("_on_delivery")


class DeliveryCallback:
    """The cookie of a record sent without a future (`Producer.produce`)."""
    __slots__ = ("_on_delivery",)

    def __init__(self, on_delivery: Callable | None) -> None:
        self._on_delivery = on_delivery


def resolve(cookie, meta, err) -> None:
    """Report one record's outcome."""
    if cookie.__class__ is tuple:
        fut, cb = cookie
    else:
        fut = cookie if cookie.__class__ is RecordFuture else None
        cb = cookie._on_delivery
    if fut is not None and not fut.done():
        if err is None:
            fut.set_result(meta)
        else:
            fut.set_exception(err)
    if cb is not None:
        _report(cb, err, meta)


def call_back(callbacks: list, metas: list, err) -> None:
    """Run a batch's delivery callbacks; one that raises is logged and the rest still run."""
    cb = callbacks[0]
    if callbacks.count(cb) == len(callbacks):
        if cb is None:
            return
        it = iter(metas)
        while True:
            try:
                deque(map(cb, repeat(err), it), maxlen=0)
                return
            except Exception:  # noqa: BLE001 - a user callback must not kill the sender
                log.exception("on_delivery callback raised")
    for cb, meta in zip(callbacks, metas):
        if cb is not None:
            _report(cb, err, meta)


def _report(cb: Callable, err, meta) -> None:
    try:
        cb(err, meta)
    except Exception:  # noqa: BLE001 - a user callback must not kill the sender
        log.exception("on_delivery callback raised")


def report(completions: list) -> None:
    """Every record of the completed batches reaches its future and callback (ProducerCore's
    Completion: the batch, its error or base offset and LogAppendTime)."""
    for c in completions:
        b = c.batch
        topic = b.tp.topic
        partition = b.tp.partition
        err = c.error
        base = c.base_offset
        lat = c.log_append_time
        cookies = b.cookies
        metas: list[Any]
        if b.whole:
            metas = [None if err is not None else SentBatch(
                topic, partition, base, b.count, lat if lat >= 0 else b.max_ts)]
        elif err is None:
            n = len(cookies)
            metas = list(map(_new_metadata, zip(
                repeat(topic, n), repeat(partition, n),
                repeat(None, n) if base is None else range(base, base + n),
                b.timestamps if lat < 0 else repeat(lat, n))))
        else:
            metas = [None] * len(cookies)
        kind = cookies[0].__class__
        if kind is tuple or list(map(type, cookies)).count(kind) != len(cookies):
            for cookie, meta in zip(cookies, metas):   # asyncio sends, mixed kinds
                resolve(cookie, meta, err)
            continue
        if kind is RecordFuture:
            complete_all(cookies, metas, err)
        call_back(list(map(_on_delivery_of, cookies)), metas, err)


class FlushWaiter(NamedTuple):
    batches: set        # the batches still to complete of those incomplete when flush began
    done: asyncio.Future


class Delivery:
    """Reports completions (`deliver`, on the loop thread, outside the core's lock) and keeps
    what waits for them: flushes and senders waiting for buffer.memory. `lock` is the
    producer's (the core's) lock; the memory condition is built on it."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._flushes: list[FlushWaiter] = []
        self._memory = threading.Condition(lock)
        self._memory_waiters = 0          # threads in wait_for_memory (under the lock)
        self._async_memory: list[asyncio.Future] = []

    def deliver(self, completions: list) -> None:
        if not completions:
            return
        report(completions)
        if self._flushes:
            finished = [c.batch for c in completions]
            for w in self._flushes:
                w.batches.difference_update(finished)
                if not w.batches and not w.done.done():
                    w.done.set_result(None)
        with self._lock:
            if self._memory_waiters:
                self._memory.notify_all()
        for fut in self._async_memory:
            if not fut.done():
                fut.set_result(None)
        self._async_memory.clear()

    async def wait_for(self, batches: set, timeout: float | None) -> None:
        """Until every batch of `batches` was delivered (asyncio.TimeoutError after `timeout`
        seconds, saying how many records are not complete)."""
        waiter = FlushWaiter(batches, asyncio.get_running_loop().create_future())
        self._flushes.append(waiter)
        try:
            await asyncio.wait_for(waiter.done, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"flush timed out after {timeout}s: {sum(b.count for b in waiter.batches)} "
                f"records sent before it are not complete") from None
        finally:
            self._flushes.remove(waiter)

    def wait_for_memory(self, timeout_s: float) -> None:
        """From a sending thread: until a batch completes (buffer.memory may have room) or
        `timeout_s` passes, whichever is first."""
        with self._lock:
            self._memory_waiters += 1
            try:
                self._memory.wait(timeout_s)
            finally:
                self._memory_waiters -= 1

    def memory_freed(self) -> asyncio.Future:
        """On the loop thread: a future done when the next batch completes."""
        w = asyncio.get_running_loop().create_future()
        self._async_memory.append(w)
        return w
