"""What a start says (issue 39, item 10): the transaction coordinator's load of its 50
partitions is one line, not fifty; a start after kill -9 says that recovery ran, a start after a
clean stop does not."""
from __future__ import annotations

import re
import time

import pytest

from oncelog.client import Producer
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

RECOVERY = "recovery ran after an unclean shutdown"


def _since(broker: BrokerProcess, mark: int) -> str:
    return broker.log_file.read_text(errors="replace")[mark:]


def _coordinating(text: str) -> list[str]:
    return [line for line in text.splitlines() if "coordinating" in line and "__transaction_state" in line]


def _once_coordinating(broker: BrokerProcess, mark: int, timeout_s: float = 60.0) -> str:
    """The log since `mark` once the coordinator's line is in it: a start is over when the broker
    listens, and the coordinator loads its partitions after that (later still on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while not _coordinating(text := _since(broker, mark)):
        assert time.monotonic() < deadline, f"no coordinator line in {timeout_s} s:\n{text[-3000:]}"
        time.sleep(0.1)
    return text


def test_one_coordinator_line_and_a_recovery_line_after_kill_9(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        assert RECOVERY not in _since(broker, 0)      # a new data directory: nothing to recover
        with Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "start-lines"}) as p:
            p.init_transactions(30)                    # creates __transaction_state's 50 partitions
            p.begin_transaction()
            for i in range(20):
                p.send("recovered", value=b"r%d" % i)
            p.commit_transaction(30)

        mark = len(broker.log_file.read_text(errors="replace"))
        broker.restart(clean=False)      # kill -9
        after_kill = _once_coordinating(broker, mark)
        lines = [line for line in after_kill.splitlines() if RECOVERY in line]
        assert len(lines) == 1 and "WARNING" in lines[0], after_kill[-3000:]
        assert re.search(r"\d+ of \d+ partitions were not closed cleanly", lines[0])
        [coordinating] = _coordinating(after_kill)
        assert re.search(r"coordinating 50 partition\(s\) of __transaction_state \(0-49\) at epoch", coordinating)

        mark = len(broker.log_file.read_text(errors="replace"))
        # SIGTERM: a clean stop leaves nothing to recover. The harness's restart kills a broker
        # that has not stopped in 20 s, and on a loaded machine 51 partitions' closing fsyncs have
        # taken longer: the test waits for the stop
        broker.stop(timeout_s=180)   # the next start says whether it was clean (a CI run saw exit -15)
        broker.start()
        after_stop = _once_coordinating(broker, mark)
        assert RECOVERY not in after_stop and len(_coordinating(after_stop)) == 1
    finally:
        broker.stop()


def test_sigterm_during_the_start_stops_the_broker_cleanly(tmp_path):
    """SIGTERM as soon as the process's first line appears (the in-process controller's, long
    before the broker listens): it stops cleanly, exit 0, as it does once running. The handlers were
    installed after "listening on" before, and a stop that came first killed it outright (exit
    -15; the next start then ran recovery on every partition, as a CI run saw)."""
    import signal
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "oncelog.cli.main", "serve", "--log-dirs", str(tmp_path / "data"),
                             "--listeners", "PLAINTEXT://127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()   # the in-process controller's first log line
        assert "oncelog.controller" in first, first
        proc.send_signal(signal.SIGTERM)
        rest = proc.stdout.read()
        assert proc.wait(60) == 0, first + rest
        assert "oncelog: shutting down" in rest, first + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
