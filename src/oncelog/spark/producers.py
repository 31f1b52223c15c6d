"""One idempotent producer per Python process and client configuration, shared by the tasks
the process runs (Spark reuses its Python workers) and by the driver's marker writes.

A producer per task and micro-batch costs an InitProducerId, a new producer id and producer
state at every partition it writes, for as long as `producer.id.expiration.ms` keeps it: at a
1 s trigger that is tens of thousands of ids a day per partition (Spark's Kafka sink pools its
producers for the same reason). Sharing is safe because a Python worker runs one task at a
time and a task ends only when every record it handed over is resolved (`task_producer`):
nothing of one task is left in flight when the next begins. A producer that failed a delivery
is closed and replaced, so a task never inherits a broken sequence or a fatal error.

Closed at interpreter exit (driver processes, tests). PySpark's daemon ends its forked workers
with os._exit, which runs no exit hook; nothing is pending then, and the broker expires the id."""
from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from oncelog.client import Producer, config_keys
from oncelog.spark.options import OncelogSparkError

# A writer task sends ~1 MB batches for several partitions at once: let one request carry
# several of them and keep more requests in flight than the client's defaults (the per-partition
# window learned from the broker still applies). batch.size is the columnar writer's batch
# (arrow_records cuts at most this much per batch) and, as in Kafka (KIP-794), how many bytes of
# keyless records stay on one partition. `kafka.`-prefixed options override these.
WRITER_DEFAULTS = {"max.request.size": str(8 << 20), "max.in.flight.requests.per.connection": "20",
                   "batch.size": "1000000"}

_lock = threading.Lock()
_pool: dict[tuple, Producer] = {}
_pid = os.getpid()


def _key(config: dict) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in config.items()))


def shared(client: dict) -> Producer:
    """The process's producer for this client configuration (opened on first use)."""
    global _pid
    config = {**WRITER_DEFAULTS, **config_keys.only(client, "producer")}
    key = _key(config)
    with _lock:
        if _pid != os.getpid():
            # a forked child: the parent's producers have no loop thread here
            _pool.clear()
            _pid = os.getpid()
        p = _pool.get(key)
        if p is not None and p.fatal_error is None and not p.closed:
            return p
        _pool.pop(key, None)
        try:
            p = _pool[key] = Producer(config)
        except Exception as e:  # noqa: BLE001
            raise OncelogSparkError(
                f"cannot start a producer for bootstrap.servers={client['bootstrap.servers']!r} "
                f"({type(e).__name__}: {e}); check that the broker is running and reachable") from e
        return p


def discard(producer: Producer) -> None:
    """Close a producer that failed (its unresolved records fail) and forget it."""
    with _lock:
        for k, p in list(_pool.items()):
            if p is producer:
                del _pool[k]
    producer.close(30)


@contextmanager
def task_producer(client: dict) -> Iterator[Producer]:
    """The shared producer for one task's records. When the task fails, every record it handed
    over is resolved before the error goes on (flush: delivered or failed), so that nothing of
    it is still in flight when the next task starts; a failed delivery also discards the
    producer. The caller checks its records' futures on success."""
    producer = shared(client)
    try:
        yield producer
    except BaseException as e:
        try:
            producer.flush()
        except BaseException:  # noqa: BLE001 - the task's own error is the one to report
            discard(producer)
            raise e  # noqa: B904 - the task's error, with the flush error attached as its context
        if isinstance(e, DeliveryFailed) or producer.fatal_error is not None:
            discard(producer)
        raise


class DeliveryFailed(OncelogSparkError):
    """A record of the task was not delivered."""


def driver_transactional_id(sink: str) -> str:
    """The transactional id through which only this sink's driver writes its records (decisions,
    batch markers): readers count a driver record only in a committed transaction of this id's
    producer id, and a new driver's InitProducerId fences an old one (a zombie)."""
    return f"{sink}-driver"


def _driver_config(client: dict, sink: str) -> dict:
    config = {**config_keys.only(client, "producer"), "transactional.id": driver_transactional_id(sink),
              "enable.idempotence": "true",
              "acks": "all", "oncelog.transaction.v2.enable": "false", "linger.ms": "0"}
    config.pop("transaction.two.phase.commit.enable", None)
    config.setdefault("transaction.timeout.ms", "60000")
    return config


def start_driver(client: dict, sink: str) -> tuple[int, int]:
    """Where the driver plans a query's write, before any of its tasks runs: InitProducerId for
    the sink's driver transactional id, which fences every earlier driver of the sink (a zombie
    of a restarted query: its next write fails with PRODUCER_FENCED). Returns the (producer id,
    epoch) that this driver's later processes go on from (`driver`)."""
    with Producer(_driver_config(client, sink)) as p:
        p.init_transactions(60)
        return p.transaction_ids


@contextmanager
def driver(client: dict, sink: str, started: tuple[int, int] | None) -> Iterator[Producer]:
    """The driver's transactional producer in the process that commits (Spark runs a sink's
    commit() in a process of its own): InitProducerId with the (producer id, epoch) of
    `start_driver`, which the coordinator grants only while no later driver started (else
    PRODUCER_FENCED: this driver is a zombie). Transactions V1, so that only starts move the
    epoch. `started` None (the sink id was unknown when the write was planned): a plain
    InitProducerId, which fences without being fenced."""
    p = Producer(_driver_config(client, sink))
    try:
        p.init_transactions(60, expected=started)
        yield p
    finally:
        p.close(10)


def close_all() -> None:
    with _lock:
        producers = list(_pool.values()) if _pid == os.getpid() else []
        _pool.clear()
    for p in producers:
        try:
            p.close(10)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


atexit.register(close_all)
