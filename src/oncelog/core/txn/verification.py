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
"""
from __future__ import annotations


class Guard:
    """One producer's guard; `checks` counts the checks holding it."""

    __slots__ = ("checks",)

    def __init__(self) -> None:
        self.checks = 0


class VerificationGuards:
    def __init__(self) -> None:
        self._guards: dict[int, Guard] = {}

    def __len__(self) -> int:
        return len(self._guards)

    def begin(self, producer_id: int) -> Guard:
        """The guard of a check that starts now: the producer's current one, or a new one."""
        guard = self._guards.get(producer_id)
        if guard is None:
            guard = self._guards[producer_id] = Guard()
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

    def clear(self, producer_id: int) -> None:
        """A marker for the producer: every check in flight for it is void."""
        self._guards.pop(producer_id, None)
