"""Spark connector tests: the session's broker (`shared_broker`) and one Spark session per test session."""
import itertools

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'oncelog[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'oncelog[spark]')")

from oncelog.client import AdminClient  # noqa: E402

_counter = itertools.count()


@pytest.fixture(scope="session")
def spark_broker(shared_broker):
    """Bootstrap address of the session's broker."""
    return shared_broker.bootstrap


@pytest.fixture
def make_topic(spark_broker, request):
    """make_topic(partitions=1) -> a fresh topic name."""
    def make(partitions: int = 1) -> str:
        name = f"spark-{request.node.name[:60]}-{next(_counter)}".replace("[", "-").replace("]", "")
        with AdminClient({"bootstrap.servers": spark_broker}) as admin:
            admin.create_topics([name], num_partitions=partitions)[name].result()
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
def write_opts(spark_broker):
    """Options for df.write.format("oncelog")."""
    return {"bootstrap.servers": spark_broker}


@pytest.fixture
def produce(spark_broker):
    """produce(topic, values, partition=None) through oncelog's producer; waits for every ack."""
    from oncelog.client import Producer

    def run(topic, values, partition=None, keys=None):
        cfg = {"bootstrap.servers": spark_broker}
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
