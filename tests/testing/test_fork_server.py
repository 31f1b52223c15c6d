"""The fork server (oncelog.testing.fork_server) starts brokers that behave as exec'd ones do
where tests look: exit status, stderr, a kill -9, the environment of their start."""
import signal

import pytest

from oncelog.client import Producer
from oncelog.testing import fork_server
from oncelog.testing.embedded import BrokerProcess, ServerProcess, _oncelog

pytestmark = pytest.mark.processes


def _refused_start(tmp_path, monkeypatch, forked: str) -> tuple[int, str]:
    monkeypatch.setenv(fork_server.ENV, forked)
    log = tmp_path / f"serve-{forked}.log"
    s = ServerProcess(_oncelog("serve", "--log-dirs", str(tmp_path / "d"), "--listeners", "PLAINTEXT://127.0.0.1:0",
                               "--override", "num.partitions=many"),
                      log_file=log)
    try:
        with pytest.raises(RuntimeError, match="did not start"):
            s.start(timeout_s=30)
    finally:
        s.stop()   # a server that started after all must not outlive the test
    assert s.proc is not None
    assert isinstance(s.proc, fork_server.ForkedProcess) == (forked == "1")
    return s.proc.wait(30), log.read_text().strip().splitlines()[-1]


def test_a_refused_start_exits_as_an_exec_d_one_does(tmp_path, monkeypatch):
    forked, execd = (_refused_start(tmp_path, monkeypatch, f) for f in ("1", "0"))
    assert forked == execd and forked[0] != 0 and "num.partitions" in forked[1], (forked, execd)


def test_a_forked_broker_is_killed_alone_and_reads_the_environment_of_its_start(tmp_path, monkeypatch):
    monkeypatch.setenv(fork_server.ENV, "1")
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS": "ledger"}).start()
    assert isinstance(b.proc, fork_server.ForkedProcess)
    b.kill()
    assert b.proc.returncode == -signal.SIGKILL
    other = BrokerProcess(tmp_path / "other").start()   # the fork server outlived its child
    assert other.stop() == 0
    b.start()
    with Producer({"bootstrap.servers": b.bootstrap}) as p:
        p.send("t", b"fsynced, and noted in the ledger")
        p.flush()
    assert b.stop() == 0
    assert list((tmp_path / "data").rglob(".fsynced")), "the failpoints of the start's environment were not used"
