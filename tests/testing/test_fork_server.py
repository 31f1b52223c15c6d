"""The fork server (oncelog.testing.fork_server) starts brokers that behave as exec'd ones do
where tests look: exit status, stderr, a kill -9, the environment of their start."""
import json
import signal
import subprocess
import sys

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


def test_a_forked_command_reads_its_stdin_and_answers_as_an_exec_d_one_does(tmp_path):
    """tests/cli's commands run forked (oncelog_cli.oncelog): stdin, stdout, stderr and the exit
    code are those of `python -m oncelog.cli.main`, and stderr carries no line of the fork
    server's own (runpy warned on every command once the command line was imported)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def both(argv: list[str], stdin: bytes = b"") -> tuple[subprocess.CompletedProcess, ...]:
        execd = subprocess.run([sys.executable, "-m", fork_server.COMMAND_LINE, *argv], input=stdin,
                               capture_output=True, timeout=60, env=env)
        return execd, fork_server.run(argv, input=stdin, env=env, timeout=60)

    refused = both(["consume", "t", "--bootstrap-server", "127.0.0.1:1"])
    line = b"oncelog: cannot reach 127.0.0.1:1: connection refused (is a broker running there?)\n"
    assert [(r.returncode, r.stdout, r.stderr) for r in refused] == [(3, b"", line)] * 2
    b = BrokerProcess(tmp_path / "data").start()
    try:
        at = ["--bootstrap-server", b.bootstrap]
        for produced in both(["produce", "t", "--format", "json", *at], stdin=b"one\ntwo\nthree\n"):
            assert produced.returncode == 0 and produced.stderr == b"", produced
            assert [json.loads(line)["partition"] >= 0 for line in produced.stdout.splitlines()] == [True] * 3
        for read in both(["consume", "t", "-n", "6", *at]):
            assert (read.returncode, sorted(read.stdout.split())) == (0, sorted([b"one", b"two", b"three"] * 2)), read
        with pytest.raises(subprocess.TimeoutExpired):   # killed at its timeout, as subprocess.run does
            fork_server.run(["consume", "t", *at], env=env, timeout=3)
    finally:
        b.stop()
