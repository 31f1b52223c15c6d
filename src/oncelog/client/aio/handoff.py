"""The handoff: how a record gets from the caller's thread into the accumulator.

Only the loop thread appends to the accumulator. A record sent on the loop thread is appended at
once (`append_on_loop`); one sent from another thread (the synchronous facade) is handed over
(`hand_over`): admitted against buffer.memory, put on a list without a lock and without a hop
through the event loop, and the loop is woken only when a batch's worth is waiting or its linger
would otherwise be overslept. The loop takes the list whole (`take`) at the start of each pass, a
partition's run of records at a time. Letting the sending threads append under the core's lock
made each side wait for the other (with the GIL, that contention cost more than the work).

The list is flat: each record is HANDOFF_FIELDS consecutive items, added by one `list.extend`
(atomic under the GIL, and no tuple per record lives on for the cyclic collector to track); the
loop cuts it into columns by slicing and into partition runs by comparing neighbours, so that
moving records costs no Python work per record."""
from __future__ import annotations

import threading
import time
from itertools import compress, repeat
from operator import is_not

from oncelog.client.aio.delivery import resolve
from oncelog.client.aio.sender import Wakeup, now_ms
from oncelog.client.errors import KafkaClientError, ProducerClosedError
from oncelog.client.producer_core import ProducerCore
from oncelog.client.txn_core import TransactionManager
from oncelog.client.types import TopicPartition

HANDOFF_FIELDS = 7   # tp, timestamp, key, value, headers, cookie, size
ENCODED = object()   # marks a send_encoded batch in the handoff (its "key")


class Handoff:
    def __init__(self, core: ProducerCore, lock: threading.Lock, wakeup: Wakeup,
                 batch_size: int, linger_ms: int) -> None:
        self.core = core
        self.lock = lock
        self.wakeup = wakeup
        self._batch_size = batch_size
        self._linger_ms = linger_ms
        self.items: list = []   # the records handed over; changed in place only, never replaced
        self._added = 0      # bytes; written by sending threads only
        self._taken = 0      # bytes; written by the loop thread only
        self.closed = False  # the producer's close took the handoff for the last time
        # read without the lock: a racing count only lets a record wait, or in, a little early
        self._admits = core.acc.admits

    # ------------------------------------------------------------------ sending threads

    def hand_over(self, tp: TopicPartition, ts: int, key, value, headers, cookie, size: int) -> bool:
        """From a thread other than the loop's: queue the record for the loop thread. False if
        buffer.memory is full (nothing was queued)."""
        core = self.core
        if core.fatal or core.topic_errors:
            core.check_accepting(tp)
        waiting = self._added - self._taken
        if not self._admits(size, waiting if waiting > 0 else 0):
            return False
        self.items.extend((tp, ts, key, value, headers, cookie, size))
        self._added += size
        if self.closed:   # close() took the handoff before this record arrived
            self._fail_late()
            return True
        # wake the loop if this fills a batch, or if it sleeps past this record's linger
        # (at_ms is 0 while it runs: it takes the handoff before it sleeps again)
        w = self.wakeup
        if not w.pending and (
                waiting + size >= self._batch_size
                or w.at_ms and w.at_ms > time.monotonic() * 1000 + self._linger_ms):
            w.set_threadsafe()
        return True

    def _fail_late(self) -> None:
        """A sender that passed the closing check just before close() began, and handed its
        record over after close() took the handoff: nobody else will, so fail what is there."""
        with self.lock:
            items = self._pop()
        err = ProducerClosedError("producer closed before delivery")
        for cookie in items[5::HANDOFF_FIELDS]:   # the cookies
            resolve(cookie, None, err)

    # ------------------------------------------------------------------ the loop thread

    def append_on_loop(self, tp: TopicPartition, ts: int, key, value, headers, cookie) -> bool:
        """On the loop thread: append at once (False if buffer.memory is full)."""
        now = now_ms()
        if self.items:
            # records other threads handed over before this one go first: a caller that sent
            # from a thread and then from the loop (or waited on one) sees its order kept
            self.take(now)
        with self.lock:
            r = self.core.append(tp, ts, key, value, headers, cookie, now)
            if r is None:
                return False
            batch, new = r
            full = batch.size >= self._batch_size
        if (new or full) and not self.wakeup.pending:
            self.wakeup.set()
        return True

    def append_encoded_on_loop(self, tp: TopicPartition, records, count: int, base_ts: int,
                               max_ts: int, cookie) -> bool:
        now = now_ms()
        if self.items:
            self.take(now)   # as in append_on_loop: earlier records first
        with self.lock:
            if self.core.append_encoded(tp, records, count, base_ts, max_ts, cookie, now) is None:
                return False
        if not self.wakeup.pending:
            self.wakeup.set()
        return True

    def take(self, now: int) -> None:
        """Move handed-over records into the accumulator, in order."""
        h = self.items
        if not h:
            return
        failed: list = []
        with self.lock:
            items = self._pop()
            cols = [items[i::HANDOFF_FIELDS] for i in range(HANDOFF_FIELDS)]
            tps = cols[0]
            m = len(tps)
            if tps.count(tps[0]) == m:
                runs = [(0, m)]
            else:   # consecutive records of one partition are appended as one run
                cuts = [0, *compress(range(1, m), map(is_not, tps[1:], tps[:-1])), m]
                runs = list(zip(cuts, cuts[1:]))
            for i, j in runs:
                run = [c[i:j] for c in cols]
                if ENCODED in run[2]:   # caller-encoded batches are queued one by one
                    for one in range(j - i):
                        self._append_run([c[one:one + 1] for c in run], now, failed)
                else:
                    self._append_run(run, now, failed)
            self._taken += sum(cols[6])
            if not h:   # resynchronise: a sender's lost update (two threads) cannot drift
                self._taken = self._added
        for cookie, e in failed:
            resolve(cookie, None, e)

    def close(self, now: int) -> None:
        """The producer closes: take what is there; a record handed over later fails at once."""
        self.closed = True
        self.take(now)

    def _pop(self) -> list:
        """Everything handed over so far (under the lock, so that one taker gets each record).
        Senders only add at the end and never lock: the items are copied, then deleted, in two
        C-level steps."""
        h = self.items
        items = h[:]
        del h[:len(items)]
        return items

    def _append_run(self, cols: list, now: int, failed: list) -> None:
        """Records of one partition as columns (tp, ts, key, value, headers, cookie, size)."""
        tps, tss, keys, values, headers, cookies, sizes = cols
        tp = tps[0]
        core = self.core
        # the producer may have gone fatal, or the topic failed, since they were admitted
        e = core.fatal or core.topic_errors.get(tp.topic)
        if e is not None:
            failed.extend(zip(cookies, repeat(e)))
        elif keys[0] is ENCODED:
            records, count, base_ts, max_ts = values[0]
            core.acc.append_encoded(tp, records, count, base_ts, max_ts, cookies[0], now, admitted=True)
        else:
            core.acc.extend(tp, tss, keys, values, headers, cookies, sizes, now)


class TxnHandoff(Handoff):
    """A transactional producer's handoff: each partition run joins the transaction (Java's
    maybeAddPartition) as it enters the accumulator, once per run rather than per record; a
    plain producer uses `Handoff` and pays nothing for it."""

    def __init__(self, core: ProducerCore, lock: threading.Lock, wakeup: Wakeup,
                 batch_size: int, linger_ms: int, txn: TransactionManager) -> None:
        super().__init__(core, lock, wakeup, batch_size, linger_ms)
        self.txn = txn

    def append_on_loop(self, tp: TopicPartition, ts: int, key, value, headers, cookie) -> bool:
        with self.lock:
            self.txn.maybe_add_partition(tp)
        return super().append_on_loop(tp, ts, key, value, headers, cookie)

    def append_encoded_on_loop(self, tp: TopicPartition, records, count: int, base_ts: int,
                               max_ts: int, cookie) -> bool:
        with self.lock:
            self.txn.maybe_add_partition(tp)
        return super().append_encoded_on_loop(tp, records, count, base_ts, max_ts, cookie)

    def _append_run(self, cols: list, now: int, failed: list) -> None:
        try:
            self.txn.maybe_add_partition(cols[0][0])
        except KafkaClientError as e:   # e.g. the transaction became abortable meanwhile
            failed.extend(zip(cols[5], repeat(e)))
            return
        super()._append_run(cols, now, failed)
