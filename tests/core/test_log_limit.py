"""A repeated failure is logged a few times a period, then counted into the next line written."""
from __future__ import annotations

from oncelog.core.log_limit import LogLimit, held_back


def test_a_burst_then_silence_then_the_count():
    limit = LogLimit(burst=3, period_s=60)
    assert [limit.allow(t) for t in (0, 1, 2)] == [(True, 0)] * 3
    assert [limit.allow(t)[0] for t in range(3, 59)] == [False] * 56
    write, held = limit.allow(60)          # a new period: written, with what was held back
    assert (write, held) == (True, 56)
    assert limit.allow(61) == (True, 0)    # counted once only
    assert held_back(56, 60) == " (56 more like it not logged; at most a few every 60 s)"
    assert held_back(0, 60) == ""
