"""`broker.net.later.Later`: callbacks run as it is resolved (no trip through the event loop),
once, in order; one that raises is logged and stops no other."""
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


def test_a_failed_later_raises_its_exception_and_a_raising_callback_stops_no_other(caplog):
    seen = []
    later = Later()

    def broken(_done: Later) -> None:
        raise RuntimeError("a callback's bug")
    later.on_done(broken)
    later.on_done(lambda done: seen.append(done.done))
    later.fail(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        later.result()
    assert seen == [True]
    assert "a callback of a Later answer failed" in caplog.text
