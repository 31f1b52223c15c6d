"""The ownership token (`storage.fence`): a new owner raises it without waiting for the old one, a
deposed owner's write is refused before it happens, and the lock is never waited on for longer
than a spin. Two processes share a token the way two brokers share a partition directory: the
second process here is a real fork, paused with SIGSTOP where the issue paused a broker."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from oncelog.storage.fence import Busy, Fenced, Lease, Token

pytestmark = pytest.mark.processes


def test_a_new_owner_raises_the_token_and_the_old_one_writes_nothing(tmp_path):
    path = tmp_path / ".leader.epoch"
    old = Lease.take(path, 3)
    with old.writing():
        pass
    new = Lease.take(path, 4)            # no wait for the old owner
    assert not old.valid() and new.valid()
    with pytest.raises(Fenced) as e, old.writing():
        raise AssertionError("a deposed owner wrote")
    assert e.value.current == 4 and old.lost
    with pytest.raises(Fenced):
        Lease.take(path, 3)              # a stale view never takes it back
    again = Lease.take(path, 4)          # the same epoch: the same owner, restarted
    assert again.valid()
    for lease in (old, new, again):
        lease.close()


def test_a_fresh_token_is_epoch_zero_and_the_first_owner_takes_it(tmp_path):
    lease = Lease.take(tmp_path / "t", 0)
    assert lease.token.current() == 0 and lease.valid()
    lease.close()


def _hold_while_paused(path, ready, raised) -> None:
    """Take the lease at epoch 1, stop inside a write (SIGSTOP of itself), finish the write
    when continued, then, once the new owner has raised the token, try to write again."""
    lease = Lease.take(path, 1)
    with lease.writing():
        ready.set()
        os.kill(os.getpid(), signal.SIGSTOP)
        (path.parent / "written").write_text("the write that held the lock")
    raised.wait(10)
    try:
        with lease.writing():
            (path.parent / "late").write_text("a write after the new owner raised the token")
    except Fenced:
        os._exit(7)
    os._exit(0)


def test_a_process_paused_inside_a_write_delays_the_raise_and_then_is_fenced(tmp_path):
    path = tmp_path / ".leader.epoch"
    Token(path).close()
    ready, raised = multiprocessing.get_context("fork").Event(), multiprocessing.get_context("fork").Event()
    child = multiprocessing.get_context("fork").Process(target=_hold_while_paused, args=(path, ready, raised))
    child.start()
    try:
        assert ready.wait(10)
        deadline = time.monotonic() + 10
        while os.waitid(os.P_PID, child.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(Busy):
            Lease.take(path, 2)          # the paused holder keeps the lock: refused, not waited on
        assert time.monotonic() - started < 1
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while True:
            try:
                new = Lease.take(path, 2)
                break
            except Busy:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        raised.set()
        child.join(10)
        assert child.exitcode == 7       # its next write was refused
        assert (tmp_path / "written").exists() and not (tmp_path / "late").exists()
        assert new.valid()
        new.close()
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGCONT)
            child.kill()


def _raise_to(path, epoch) -> None:
    Lease.take(path, epoch).close()
    os._exit(0)


def test_another_process_raising_the_token_is_seen_without_a_lock(tmp_path):
    path = tmp_path / ".leader.epoch"
    lease = Lease.take(path, 5)
    child = multiprocessing.get_context("fork").Process(target=_raise_to, args=(path, 6))
    child.start()
    child.join(10)
    assert child.exitcode == 0
    assert lease.token.current() == 6 and not lease.valid()
    lease.close()
