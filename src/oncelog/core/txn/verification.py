"""KIP-890 part 1's verification guards of one partition, sans-IO (Kafka's VerificationGuard in
`ProducerStateManager`'s verification state entries).

A partition leader asks the coordinator whether a producer's first transactional batch belongs to
its ongoing transaction. While the answer is on its way, a marker may end that transaction; the
batch must then be refused rather than open a transaction nobody will end. So each check holds
a guard taken before asking, a marker for the producer clears it, and the batch is appended only
if its guard is still the producer's.

Checks of one producer that overlap (its requests on two connections; one connection handles
one request at a time) share one guard, as `maybeCreateVerificationStateEntry` returns the
existing entry: a check must not void another's. The guard is dropped when the last check holding
it ends, or by a marker.

Transactions V2 bumps the epoch at every EndTxn and writes the markers at the new epoch, which is
the next transaction's: a V2 marker at a V2 check's own epoch ended the transaction before it,
and keeps the guard (Kafka's `UnifiedLog.updateProducers`). A check of an older epoch sharing
that guard is refused by the epoch check that precedes the guard's at append (the marker raised
the partition's epoch above it). A V1 marker (its EndTxn bumped nothing) voids every check: at
the check's own epoch it may have ended the check's own transaction, as it does when a client
mixes EndTxn v4 with Produce v12 in one transaction.
"""
from __future__ import annotations


def voids(marker_epoch: int, marker_v2: bool, check_epoch: int, check_v2: bool) -> bool:
    """Whether a marker for a producer at `marker_epoch` voids its check of a batch (or a
    TxnOffsetCommit) at `check_epoch`: always, unless both are Transactions V2 and the marker is
    at the check's epoch (the previous transaction's marker, written at the epoch its EndTxn
    bumped to)."""
    return not (marker_v2 and check_v2 and marker_epoch == check_epoch)


class Guard:
    """One producer's guard; `checks` counts the checks holding it."""

    __slots__ = ("checks", "epoch", "v2")

    def __init__(self, epoch: int, v2: bool) -> None:
        self.checks = 0
        self.epoch = epoch  # the highest epoch of the checks that took it
        self.v2 = v2        # every one of them Transactions V2 (the epoch bumps per transaction)


class VerificationGuards:
    def __init__(self) -> None:
        self._guards: dict[int, Guard] = {}

    def __len__(self) -> int:
        return len(self._guards)

    def begin(self, producer_id: int, epoch: int, v2: bool) -> Guard:
        """The guard of a check of the producer's batch at `epoch` that starts now: the producer's
        current one, or a new one. `v2`: the batch's transaction is Transactions V2."""
        guard = self._guards.get(producer_id)
        if guard is None:
            guard = self._guards[producer_id] = Guard(epoch, v2)
        else:
            guard.epoch = max(guard.epoch, epoch)
            guard.v2 = guard.v2 and v2
        guard.checks += 1
        return guard

    def valid(self, producer_id: int, guard: Guard) -> bool:
        """No marker for the producer since the guard was taken."""
        return self._guards.get(producer_id) is guard

    def end(self, producer_id: int, guard: Guard) -> None:
        """The check is over (appended or refused)."""
        guard.checks -= 1
        if guard.checks == 0 and self._guards.get(producer_id) is guard:
            del self._guards[producer_id]

    def clear(self, producer_id: int, marker_epoch: int, marker_v2: bool) -> None:
        """A marker for the producer at `marker_epoch` (`marker_v2`: of a Transactions V2
        transaction): every check in flight for it is void, unless marker and checks are V2 and
        at that epoch (the marker ended the transaction before theirs)."""
        guard = self._guards.get(producer_id)
        if guard is not None and voids(marker_epoch, marker_v2, guard.epoch, guard.v2):
            del self._guards[producer_id]
