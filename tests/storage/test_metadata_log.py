"""The controller's metadata log (storage/metadata_log.py): a torn tail is cut, a corrupt snapshot set
aside, and (issue 13 item 4) under a full disk and failed fsyncs nothing is kept that is not
durable and replay always starts again."""
from __future__ import annotations

import struct

import pytest

from oncelog.core.controller_state import ControllerState
from oncelog.storage import failpoints as fp
from oncelog.storage.metadata_log import MetadataLog, MetadataLogError


@pytest.fixture(autouse=True)
def _failpoints_off_afterwards():
    yield
    fp.configure(None)


def block(next_id: int) -> dict:
    return {"type": "pid_block", "broker_id": 1, "broker_epoch": 1, "next_producer_id": next_id}


def replay(directory) -> ControllerState:
    s = ControllerState()
    for _off, r in MetadataLog(directory, read_only=True).read():
        s.replay(r)
    return s


@pytest.mark.parametrize("fault", ["shortwrite", "enospc", "fsync-eio"])
def test_a_failed_append_leaves_nothing_and_the_next_one_follows_the_last_durable_record(tmp_path, fault):
    log = MetadataLog(tmp_path)
    log.append([block(1000)])
    size = (tmp_path / "metadata.log").stat().st_size
    fp.configure(f"{fault}:metadata")
    with pytest.raises(MetadataLogError):
        log.append([block(2000)])
    assert (tmp_path / "metadata.log").stat().st_size == size
    assert log.end_offset == 1
    log.append([block(2000)])            # the same decision, made again, is written once
    log.append([block(3000)])
    log.close()
    assert replay(tmp_path).next_producer_id == 3000   # replay starts (no "must increase")
    assert [r["next_producer_id"] for _o, r in MetadataLog(tmp_path, read_only=True).read()] == [1000, 2000, 3000]


def test_a_cut_that_fails_refuses_every_later_append(tmp_path):
    log = MetadataLog(tmp_path)
    log.append([block(1000)])
    fp.configure("shortwrite:metadata,truncate-eio:metadata")
    with pytest.raises(MetadataLogError):
        log.append([block(2000)])
    fp.configure(None)
    assert log.failed
    with pytest.raises(MetadataLogError):
        log.append([block(2000)])
    log.close()
    # a restart recovers: the torn tail is cut and the log continues after the last whole record
    again = MetadataLog(tmp_path)
    assert not again.failed and again.end_offset == 1
    again.append([block(2000)])
    assert replay(tmp_path).next_producer_id == 2000


def test_torn_metadata_log_tail_is_ignored_and_truncated(tmp_path, caplog):
    log = MetadataLog(tmp_path)
    log.append([{"type": "pid_block", "n": 1}, {"type": "pid_block", "n": 2}])
    log.close()
    path = tmp_path / "metadata.log"
    good = path.stat().st_size
    with open(path, "ab") as f:
        f.write(struct.pack(">II", 100, 0) + b'{"type": "pid_bl')
    again = MetadataLog(tmp_path)
    assert [r["n"] for _o, r in again.read()] == [1, 2]
    assert path.stat().st_size == good
    assert "torn or corrupt tail" in caplog.text
    again.append([{"type": "x", "n": 3}])
    assert [r["n"] for _o, r in MetadataLog(tmp_path, read_only=True).read()] == [1, 2, 3]


def test_corrupt_snapshot_is_set_aside(tmp_path):
    log = MetadataLog(tmp_path)
    log.append([{"type": "a"}])
    path = log.write_snapshot(1, {"k": 1})
    path.write_text(path.read_text().replace('"k": 1', '"k": 2'))
    assert log.latest_snapshot() is None
    assert path.with_suffix(".corrupt").exists()
