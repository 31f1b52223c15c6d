"""storage.producer_state_store: the partition's snapshot files — written and kept, the newest
readable one loaded, the unreadable set aside, the ones beyond the log end removed."""
from __future__ import annotations

from oncelog.core.producer_state import ProducerStateConfig, ProducerStateManager
from oncelog.storage import producer_snapshots as snaps
from oncelog.storage.producer_state_store import ProducerStateStore


def _cols(pid: int):
    m = ProducerStateManager(ProducerStateConfig(), hash_key=1)
    m.record(pid, 0, 0, 1, 0, -1, 1_000)
    return m.columns()


def _pids(cols) -> list[int]:
    return list(cols.pid)


def test_write_keeps_the_newest(tmp_path):
    store = ProducerStateStore(tmp_path, keep=2)
    for offset in (10, 20, 30):
        store.write(offset, _cols(offset), sync=True)
    assert [o for o, _p in snaps.list_snapshots(tmp_path)] == [20, 30]


def test_load_takes_the_newest_readable_at_or_below_the_log_end(tmp_path):
    store = ProducerStateStore(tmp_path, keep=5)
    for offset in (10, 20, 30, 40):
        store.write(offset, _cols(offset), sync=True)
    snaps.snapshot_path(tmp_path, 30).write_bytes(b"torn")
    seen = []
    loaded = store.load(35, lambda cols: seen.append(_pids(cols)))
    assert loaded == (20, 1) and seen == [[20]]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00000000000000000010.pstate", "00000000000000000020.pstate",
                     "00000000000000000030.pstate.corrupt"]  # 40 was beyond the log end


def test_a_snapshot_its_state_refuses_is_set_aside_too(tmp_path):
    store = ProducerStateStore(tmp_path)
    store.write(10, _cols(1), sync=True)
    store.write(20, _cols(2), sync=True)

    def apply(cols):
        if _pids(cols) == [2]:
            raise ValueError("refused")

    assert store.load(100, apply) == (10, 1)
    assert store.load(5, apply) == (None, 0)


def test_delete_beyond(tmp_path):
    store = ProducerStateStore(tmp_path)
    for offset in (10, 20, 30):
        store.write(offset, _cols(offset), sync=False)
    store.delete_beyond(20)
    assert [o for o, _p in snaps.list_snapshots(tmp_path)] == [10, 20]
