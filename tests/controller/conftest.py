"""A controller and brokers as real processes for the cluster tests."""
import re
import subprocess
import sys
import threading
import time

import pytest

from oncelog.testing.embedded import BrokerProcess

USER, PASSWORD = "broker", "broker-secret"


class ControllerProcess:
    def __init__(self, metadata_dir, extra_users=(), port=0):
        self.metadata_dir, self.extra_users, self.port = metadata_dir, list(extra_users), port
        self.proc = None

    def start(self):
        cmd = [sys.executable, "-m", "oncelog.cli.main", "controller", "--metadata-dir", str(self.metadata_dir),
               "--listener", f"127.0.0.1:{self.port}", "--user", f"{USER}:{PASSWORD}",
               "--cluster-principal", USER, "--session-timeout-ms", "2000"]
        for u in self.extra_users:
            cmd += ["--user", u]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            line = self.proc.stdout.readline().decode()
            m = re.search(r"controller listening on ([\d.]+):(\d+)", line)
            if m:
                self.port = int(m.group(2))
                break
            if not line or time.monotonic() > deadline:
                raise RuntimeError("controller did not start")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        return self

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def broker_overrides(controller, node_id, user=USER, password=PASSWORD):
    return {"node.id": str(node_id), "controller.quorum.bootstrap.servers": controller.address,
            "controller.sasl.plain.username": user, "controller.sasl.plain.password": password}


@pytest.fixture
def cluster(tmp_path):
    """start(n) -> (controller, [brokers]); everything is stopped after the test."""
    started = []

    def start(n=3):
        c = ControllerProcess(tmp_path / "metadata").start()
        started.append(c)
        brokers = []
        for i in range(1, n + 1):
            b = BrokerProcess(tmp_path / f"broker{i}", broker_overrides(c, i)).start()
            started.append(b)
            brokers.append(b)
        return c, brokers

    yield start
    for x in reversed(started):
        x.stop()
