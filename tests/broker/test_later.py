"""`broker.net.later.Later`: callbacks run as it is resolved (no trip through the event loop),
once, in order; `then` hands on a value or an exception."""
from __future__ import annotations

import pytest

from oncelog.broker.net.later import Later


def test_callbacks_run_when_it_is_resolved_and_at_once_after():
    seen = []
    later = Later()
    later.on_done(lambda done: seen.append(("first", done.result())))
    later.on_done(lambda done: seen.append(("second", done.result())))
    assert seen == [] and not later.done
    later.resolve(7)
    assert seen == [("first", 7), ("second", 7)]
    later.on_done(lambda done: seen.append(("late", done.result())))
    assert seen[-1] == ("late", 7)


def test_it_is_resolved_once():
    later = Later()
    later.resolve(1)
    later.resolve(2)
    later.fail(RuntimeError("too late"))
    assert later.result() == 1


def test_then_hands_on_a_value_or_the_exception():
    source = Later()
    doubled = source.then(lambda v: v * 2)
    source.resolve(21)
    assert doubled.done and doubled.result() == 42

    failing = Later()
    step = failing.then(lambda v: v * 2)
    failing.fail(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        step.result()

    raising = Later()
    broken = raising.then(lambda _v: 1 // 0)
    raising.resolve(1)
    with pytest.raises(ZeroDivisionError):
        broken.result()
