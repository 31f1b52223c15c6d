"""How often a repeated log line is written: a failure that repeats with every request (a full
disk answers every Produce) is logged a few times, then counted, and the count goes out with the
next line that is written. The clock is passed in (seconds, any monotonic origin)."""
from __future__ import annotations


class LogLimit:
    """At most `burst` lines per `period_s`; `allow(now)` says whether this one is written and
    how many were held back since the last one that was."""

    def __init__(self, burst: int = 3, period_s: float = 60.0) -> None:
        self.burst = burst
        self.period_s = period_s
        self._window_start: float | None = None
        self._written = 0
        self.suppressed = 0      # held back since the last line written

    def allow(self, now: float) -> tuple[bool, int]:
        """(write this line?, lines held back before it): a written line says the count, which
        then starts again from 0."""
        if self._window_start is None or now - self._window_start >= self.period_s:
            self._window_start, self._written = now, 0
        if self._written < self.burst:
            self._written += 1
            held, self.suppressed = self.suppressed, 0
            return True, held
        self.suppressed += 1
        return False, 0


def held_back(count: int, period_s: float) -> str:
    """The suffix a written line carries for the lines held back before it."""
    if not count:
        return ""
    return f" ({count} more like it not logged; at most a few every {period_s:g} s)"
