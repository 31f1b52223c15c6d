"""storage.failpoints: the syntax, when a rule fires, that it costs nothing when off, and the
faults themselves over real files (a crash is a real SIGKILL of a child process)."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from oncelog.storage import failpoints as fp


@pytest.fixture(autouse=True)
def _off_afterwards():
    yield
    fp.configure(None)


def test_off_means_the_os_functions_themselves():
    fp.configure(None)
    assert fp.log_write is os.pwrite and fp.log_sync is os.fsync and fp.log_truncate is os.ftruncate
    assert fp.log_rename is os.replace
    assert fp.meta_write is os.write and fp.meta_sync is os.fsync and fp.meta_truncate is os.ftruncate
    assert fp.share_write is os.pwrite and fp.share_sync is os.fsync


def test_syntax():
    rules = fp.parse("fsync-eio:log:after=3:times=2, shortwrite:metadata,crash:log:at=fsync:match=orders-0,ledger")
    assert [(r.fault, r.target, r.after, r.times, r.match, r.at) for r in rules] == [
        ("fsync-eio", "log", 3, 2, "", "write"), ("shortwrite", "metadata", 0, 1, "", "write"),
        ("crash", "log", 0, 1, "orders-0", "fsync"), ("ledger", "any", 0, 1, "", "write")]
    assert [(r.target, r.at) for r in fp.parse("crash:share:at=synced")] == [("share", "synced")]
    for bad in ("fsync", "fsync-eio:disk", "enospc:log:after=x", "crash:log:at=read", "shortwrite:log:every=2"):
        with pytest.raises(fp.FailpointSyntaxError):
            fp.parse(bad)


def test_after_times_and_match(tmp_path):
    fp.configure("fsync-eio:log:after=2:times=2:match=keep")
    keep = os.open(tmp_path / "keep.log", os.O_RDWR | os.O_CREAT)
    other = os.open(tmp_path / "other.log", os.O_RDWR | os.O_CREAT)
    outcomes = []
    for fd in (keep, other, keep, keep, keep, keep):
        try:
            fp.log_sync(fd)
            outcomes.append("ok")
        except OSError as e:
            outcomes.append(errno.errorcode[e.errno])
    assert outcomes == ["ok", "ok", "ok", "EIO", "EIO", "ok"]
    fp.meta_sync(keep)  # another target: not counted
    assert fp.rules()[0].seen == 5


def test_short_write_and_enospc(tmp_path):
    fd = os.open(tmp_path / "a.log", os.O_RDWR | os.O_CREAT)
    fp.configure("shortwrite:log,enospc:log:after=1")
    assert fp.log_write(fd, b"0123456789", 0) == 5
    with pytest.raises(OSError) as e:
        fp.log_write(fd, b"0123456789", 5)
    assert e.value.errno == errno.ENOSPC
    assert fp.log_write(fd, b"abc", 5) == 3
    assert open(tmp_path / "a.log", "rb").read() == b"01234abc"


def test_ledger_records_the_size_each_fsync_covered(tmp_path):
    fp.configure("ledger:log")
    fd = os.open(tmp_path / "00000000000000000000.log", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"x" * 10)
    fp.log_sync(fd)
    os.write(fd, b"y" * 5)
    assert fp.read_ledger(tmp_path) == {"00000000000000000000.log": 10}
    fp.log_sync(fd)
    assert fp.read_ledger(tmp_path) == {"00000000000000000000.log": 15}
    fp.meta_sync(fd)  # target metadata: not in a log-only ledger
    assert (tmp_path / fp.LEDGER).read_text().count("\n") == 2


def test_a_rename_carries_the_ledger_entry_to_the_new_name(tmp_path):
    """The cleaner's swap renames a fsynced `.log.cleaned` over the segment: a power loss keeps
    what was fsynced under the old name, so the ledger says so for the new one."""
    fp.configure("ledger:log")
    fd = os.open(tmp_path / "00000000000000000000.log.cleaned", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"x" * 7)
    fp.log_sync(fd)
    os.close(fd)
    fp.log_rename(tmp_path / "00000000000000000000.log.cleaned", tmp_path / "00000000000000000000.log")
    assert fp.read_ledger(tmp_path)["00000000000000000000.log"] == 7


def _child(code: str, spec: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, fp.ENV: spec},
                          cwd=tmp_path, capture_output=True, timeout=60)


def test_environment_variable_is_read_at_import(tmp_path):
    code = ("from oncelog.storage import failpoints as fp; import os; "
            "print([(r.fault, r.target, r.after) for r in fp.rules()], fp.log_write is os.pwrite)")
    out = _child(code, "enospc:log:after=7", tmp_path)
    assert out.stdout.decode().strip() == "[('enospc', 'log', 7)] False"


@pytest.mark.parametrize("at, expected", [("write", b"written"), ("fsync", b"written")])
def test_crash_kills_the_process_between_write_and_fsync(tmp_path, at, expected):
    code = ("from oncelog.storage import failpoints as fp; import os\n"
            "fd = os.open('seg.log', os.O_RDWR | os.O_CREAT)\n"
            "fp.log_write(fd, b'written', 0)\n"
            "fp.log_sync(fd)\n"
            "print('survived')\n")
    out = _child(code, f"crash:log:at={at}", tmp_path)
    assert out.returncode == -signal.SIGKILL
    assert b"survived" not in out.stdout
    assert (tmp_path / "seg.log").read_bytes() == expected


def test_crash_at_synced_kills_the_process_right_after_the_fsync(tmp_path):
    """What `tests/broker/test_share_state_crash.py` needs: durable, and nobody told."""
    code = ("from oncelog.storage import failpoints as fp; import os\n"
            "fd = os.open('share-state.log', os.O_RDWR | os.O_CREAT)\n"
            "fp.share_write(fd, b'written', 0)\n"
            "fp.share_sync(fd)\n"
            "print('survived')\n")
    out = _child(code, "crash:share:at=synced,ledger:share", tmp_path)
    assert out.returncode == -signal.SIGKILL and b"survived" not in out.stdout
    assert fp.read_ledger(tmp_path) == {"share-state.log": len(b"written")}   # the fsync happened


def test_crash_at_rename_kills_the_process_before_the_rename(tmp_path):
    code = ("from oncelog.storage import failpoints as fp\n"
            "open('seg.log.swap', 'w').close()\n"
            "fp.log_rename('seg.log.swap', 'seg.log')\n"
            "print('survived')\n")
    out = _child(code, "crash:log:at=rename:match=.swap", tmp_path)
    assert out.returncode == -signal.SIGKILL and b"survived" not in out.stdout
    assert (tmp_path / "seg.log.swap").exists() and not (tmp_path / "seg.log").exists()
