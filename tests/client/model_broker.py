"""A model of the broker's idempotence rules for the client core's tests: one log per partition,
Kafka's window-mode dedup (retain the last N batches per producer) or KIP-758 range mode, epochs,
and hooks to lose state (UNKNOWN_PRODUCER_ID) or acknowledged data (a lost leader)."""
from __future__ import annotations

from collections import deque

from oncelog.client.producer_core import PartitionResult
from oncelog.protocol.errors import ErrorCode as E

SPACE = 2**31


class ModelPartition:
    def __init__(self, window: int = 5, *, report_window: bool = True, range_threshold: int | None = None,
                 reported: int | None = None):
        self.window = window
        self.report_window = report_window      # False = an old broker (no ProduceResponse v14 field)
        self.reported = window if reported is None else reported   # a broker may send nonsense
        self.range_threshold = range_threshold  # set = range mode (KIP-758)
        self.log: list = []                     # record cookies in log order
        self.deleted: list = []                 # what retention removed (offsets 0..log_start-1)
        self.log_start = 0
        self.retained: dict[int, deque] = {}    # pid -> (epoch, first, last, base_offset)
        self.epochs: dict[int, int] = {}
        self.unknown_after_loss = False
        self.leader: int | None = None          # set: only this node may append (leader moves)
        self.leader_epoch = 0

    def _result(self, code, base=-1) -> PartitionResult:
        return PartitionResult(
            error_code=code, base_offset=base, log_start_offset=self.log_start,
            batches_to_retain=self.reported if self.report_window else None,
            max_inflight_sequences=self.range_threshold)

    def append(self, pid: int, epoch: int, base_seq: int, cookies: list) -> PartitionResult:
        n = len(cookies)
        if pid < 0:
            base = self.log_start + len(self.log)
            self.log.extend(cookies)
            return self._result(0, base)
        last = (base_seq + n - 1) % SPACE
        known = self.epochs.get(pid)
        entries = self.retained.get(pid)
        if known is not None and epoch < known:
            return self._result(E.INVALID_PRODUCER_EPOCH)
        if known is None or not entries:
            if base_seq != 0 and self.unknown_after_loss:
                return self._result(E.UNKNOWN_PRODUCER_ID)
        elif epoch > known:
            if base_seq != 0:
                return self._result(E.OUT_OF_ORDER_SEQUENCE_NUMBER)
        else:
            for (e, first, lst, off) in entries:
                if e == epoch and first == base_seq and lst == last:
                    return self._result(0, off)
            latest = entries[-1][2]
            if self.range_threshold is not None:
                dist = (latest - base_seq) % SPACE
                if dist < self.range_threshold:
                    return self._result(E.DUPLICATE_SEQUENCE_NUMBER)
            if base_seq != (latest + 1) % SPACE:
                return self._result(E.OUT_OF_ORDER_SEQUENCE_NUMBER)
        base = self.log_start + len(self.log)
        self.log.extend(cookies)
        if known is None or epoch != known:
            self.retained[pid] = deque()
        self.epochs[pid] = epoch
        q = self.retained.setdefault(pid, deque())
        q.append((epoch, base_seq, last, base))
        keep = 1 if self.range_threshold is not None else self.window
        while len(q) > keep:
            q.popleft()
        return self._result(0, base)

    def expire_producers(self) -> None:
        """producer.id.expiration.ms passed: the broker forgets every producer."""
        self.retained.clear()
        self.epochs.clear()
        self.unknown_after_loss = True

    def delete_before(self, offset: int) -> None:
        """Retention: the log start moves up (records below it are gone, as in Kafka)."""
        drop = offset - self.log_start
        self.deleted += self.log[:drop]
        self.log = self.log[drop:]
        self.log_start = offset

    def lose_tail(self, count: int) -> None:
        """A leader died with unreplicated records (acks=1): they are gone, state rolls back."""
        del self.log[len(self.log) - count:]
        for q in self.retained.values():
            while q and q[-1][3] >= self.log_start + len(self.log):
                q.pop()


def batch_cookies(batch) -> list:
    return list(batch.cookies)
