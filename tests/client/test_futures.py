"""RecordFuture behaves as a concurrent.futures.Future across threads."""
import concurrent.futures as cf
import threading

import pytest

from oncelog.client.futures import RecordFuture


def test_result_and_callbacks_across_threads():
    for trial in range(500):
        f = RecordFuture()
        got = []
        f.add_done_callback(lambda x, got=got: got.append(x.result()))
        t = threading.Thread(target=f.set_result, args=(trial,))
        t.start()
        assert f.result(5) == trial
        t.join()
        assert got == [trial]
        late = []
        f.add_done_callback(lambda x, late=late: late.append(x.result()))
        assert late == [trial]


def test_wait_and_as_completed():
    fs = [RecordFuture() for _ in range(10)]
    timer = threading.Timer(0.02, lambda: [x.set_result(i) for i, x in enumerate(fs)])
    timer.start()
    done, not_done = cf.wait(fs, 5)
    assert len(done) == 10 and not not_done
    assert sorted(f.result() for f in cf.as_completed(fs, 5)) == list(range(10))


def test_exception_and_no_cancel():
    g = RecordFuture()
    assert isinstance(g, cf.Future) and not g.cancel()
    threading.Timer(0.01, lambda: g.set_exception(ValueError("boom"))).start()
    with pytest.raises(ValueError, match="boom"):
        g.result(5)
    assert isinstance(g.exception(), ValueError)
    with pytest.raises(cf.TimeoutError):
        RecordFuture().result(0.01)


def test_complete_all_wakes_waiters_and_runs_callbacks():
    from oncelog.client.futures import complete_all
    fs = [RecordFuture() for _ in range(5)]
    seen = []
    fs[1].add_done_callback(lambda f: seen.append(f.result()))
    waiter = threading.Thread(target=lambda: seen.append(("waited", fs[3].result(5))))
    waiter.start()
    complete_all(fs, list(range(5)), None)
    waiter.join(5)
    assert [f.result(0) for f in fs] == list(range(5))
    assert 1 in seen and ("waited", 3) in seen
    gs = [RecordFuture() for _ in range(3)]
    complete_all(gs, None, RuntimeError("x"))
    assert all(isinstance(g.exception(0), RuntimeError) for g in gs)
