"""Workloads: unique values produced by one client (oncelog, librdkafka, kafka-python), every
acknowledgement and error recorded as checker Events, plus what the client says recovery cost
(retries, epoch bumps). `read_range` reads partitions back for the checker."""
from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TypeVar

from oncelog.testing.checker import Event

T = TypeVar("T")

# A position in the run's history, shared by every workload thread. count.__next__ is one C
# call, atomic under the GIL, so no lock is needed (a 1M-record run once hung with every
# workload thread waiting on the lock that used to guard it).
_t = itertools.count().__next__


@dataclass
class Workload:
    bootstrap: str
    topic: str
    records: int
    producer: str                        # a name unique in the run; values (and keys) are f"{producer}-{i}"
    rate: float | None = None            # records/s; None = as fast as the client goes
    gate: threading.Event | None = None  # cleared = pause sending (the expiry fault idles producers)
    timeout_s: float = 120
    stall_s: float = 30                  # third-party clients: no acknowledgement this long = stuck
    config: dict = field(default_factory=dict)   # producer settings on top of the workload's own
    security: dict = field(default_factory=dict)  # security.protocol, sasl.*, ssl.* (librdkafka's names)
    events: list[Event] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)

    client = "?"

    def __post_init__(self) -> None:
        self.instance = self.producer    # events name the producer instance: order is per instance

    def run(self) -> None:
        raise NotImplementedError

    def restart(self, why: str) -> None:
        """A third-party producer went fatal or got stuck: as an application would, replace it
        with a new instance (a new producer id) and go on. The old instance's fate is a finding
        blamed on the client; its unacknowledged records are not losses."""
        self.stats["restarts"] += 1
        self.events.append(Event(_t(), self.client, self.instance, "fatal", b"", None, None, why[:300]))
        self.instance = f"{self.producer}#{self.stats['restarts'] + 1}"

    def values(self):
        """Yields the values to send, honouring the pace and the gate."""
        start = time.monotonic()
        for i in range(self.records):
            if self.gate is not None and not self.gate.is_set():
                yield None                # let the caller serve callbacks while paused
                while not self.gate.wait(0.1):
                    yield None
            if self.rate and i % 50 == 0:
                ahead = start + i / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            value = f"{self.producer}-{i}".encode()
            self.events.append(Event(_t(), self.client, self.instance, "send", value))
            yield value


class LibrdkafkaWorkload(Workload):
    client = "librdkafka"

    def run(self) -> None:
        from confluent_kafka import KafkaException, Producer
        fatal: list[str] = []

        def cb(err, msg, instance) -> None:
            v = msg.value()
            if err is None:
                self.events.append(Event(_t(), self.client, instance, "ack", v, msg.partition(), msg.offset()))
            else:
                self.events.append(Event(_t(), self.client, instance, "error", v, msg.partition(), None,
                                         err.name()))
                if err.fatal() and not fatal:
                    fatal.append(f"{err.name()}: {err.str()}")

        def start():
            return Producer({"bootstrap.servers": self.bootstrap, **self.security,
                             "enable.idempotence": True, "linger.ms": 5,
                             "message.timeout.ms": int(self.timeout_s * 1000), "socket.timeout.ms": 5000,
                             "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 500, "log_level": 3})

        def replace(p, why: str):
            try:
                p.flush(5)   # librdkafka fails what it holds after a fatal error: collect those answers
            except KafkaException:
                pass
            self.restart(why)
            fatal.clear()
            return start()

        p = start()
        for v in self.values():
            try:
                if v is None:
                    p.poll(0.05)
                    continue
                instance = self.instance
                while True:
                    try:
                        p.produce(self.topic, v, key=v, on_delivery=lambda e, m, i=instance: cb(e, m, i))
                        break
                    except BufferError:
                        p.poll(0.05)
                p.poll(0)
            except KafkaException as e:
                fatal.append(str(e.args[0]) if e.args else str(e))
            except Exception as e:  # noqa: BLE001 - confluent-kafka has raised SystemError from inside a callback
                fatal.append(f"{type(e).__name__}: {e}")
            if fatal:
                p = replace(p, fatal[0])
        try:
            p.flush(self.timeout_s)
        except KafkaException as e:
            self.restart(str(e))


class KafkaPythonWorkload(Workload):
    client = "kafka-python"

    def run(self) -> None:
        from kafka import KafkaProducer

        def start():
            return KafkaProducer(bootstrap_servers=self.bootstrap, **kafka_python_security(self.security),
                                 enable_idempotence=True, acks="all",
                                 linger_ms=5, request_timeout_ms=5000, retry_backoff_ms=20,
                                 delivery_timeout_ms=int(self.timeout_s * 1000))

        kp, pending = start(), []
        last_ack = time.monotonic()
        for n, v in enumerate(self.values()):
            if v is not None:
                pending.append((v, self.instance, kp.send(self.topic, v, key=v)))
            if n % 100 == 0:
                pending, acked = self._harvest(pending)
                now = time.monotonic()
                if acked or not pending:
                    last_ack = now
                elif now - last_ack > self.stall_s:  # e.g. its UNKNOWN_PRODUCER_ID loop
                    _close(kp, 0)
                    self._harvest(pending, abandon=f"abandoned: its producer made no progress for {self.stall_s:.0f}s")
                    self.restart(f"stuck: no acknowledgement for {self.stall_s:.0f}s with "
                                 f"{len(pending)} records pending")
                    kp, pending, last_ack = start(), [], now
        try:
            kp.flush(self.timeout_s)
        except Exception:  # noqa: BLE001 - what did not make it is on the futures
            pass
        pending, _ = self._harvest(pending)
        if pending:
            self.restart(f"stuck: {len(pending)} records unanswered after flush({self.timeout_s:.0f}s)")
            self._harvest(pending, abandon="not acknowledged within its delivery timeout")
        _close(kp, 0 if pending else 5)

    def _harvest(self, pending, abandon: str | None = None):
        """Records the outcome of finished sends; returns (still pending, how many were acked)."""
        left, acked = [], 0
        for v, instance, f in pending:
            if f.is_done:
                if f.succeeded():
                    md = f.value
                    self.events.append(Event(_t(), self.client, instance, "ack", v, md.partition, md.offset))
                    acked += 1
                else:
                    self.events.append(Event(_t(), self.client, instance, "error", v, None, None,
                                             f"{type(f.exception).__name__}: {f.exception}"[:200]))
            elif abandon is not None:
                self.events.append(Event(_t(), self.client, instance, "error", v, None, None, abandon))
            else:
                left.append((v, instance, f))
        return left, acked


def _close(kp, timeout_s: float) -> None:
    try:
        kp.close(timeout_s)
    except Exception:  # noqa: BLE001 - kafka-python raises when its sender does not stop in time; it is abandoned
        pass


class OncelogWorkload(Workload):
    client = "oncelog"

    def run(self) -> None:
        from oncelog.client import Producer
        from oncelog.client.errors import ProducerFatalError
        futs = []
        with Producer({"bootstrap.servers": self.bootstrap, **self.security, "linger.ms": 5,
                       "enable.idempotence": "required",
                       "delivery.timeout.ms": int(self.timeout_s * 1000), "request.timeout.ms": 5000,
                       **self.config}) as p:
            for v in self.values():
                if v is not None:
                    futs.append((v, p.send(self.topic, v, key=v)))
            try:
                p.flush(self.timeout_s)
            except Exception:  # noqa: BLE001 - failures are on the futures
                pass
            for v, f in futs:
                try:
                    md = f.result(self.timeout_s)
                    self.events.append(Event(_t(), self.client, self.producer, "ack", v, md.partition, md.offset))
                except FutureTimeout:
                    self.events.append(Event(_t(), self.client, self.producer, "fatal", v, None, None,
                                             f"never resolved: no outcome {self.timeout_s:.0f}s after flush"))
                except Exception as e:  # noqa: BLE001 - every failed future is an event for the checker
                    kind = "fatal" if isinstance(e, ProducerFatalError) else "error"
                    # the producer says whether a failed record may be in the log anyway
                    self.events.append(Event(_t(), self.client, self.producer, kind, v, None, None,
                                             f"{type(e).__name__}: {e}"[:200],
                                             getattr(e, "possibly_written", None)))
            self.stats.update(p.stats)


WORKLOADS: dict[str, type[Workload]] = {"oncelog": OncelogWorkload, "librdkafka": LibrdkafkaWorkload,
                                        "kafka-python": KafkaPythonWorkload}


def kafka_python_security(security: dict) -> dict:
    """librdkafka's security names as kafka-python's keyword arguments."""
    names = {"security.protocol": "security_protocol", "ssl.ca.location": "ssl_cafile",
             "sasl.mechanism": "sasl_mechanism", "sasl.username": "sasl_plain_username",
             "sasl.password": "sasl_plain_password", "ssl.certificate.location": "ssl_certfile",
             "ssl.key.location": "ssl_keyfile"}
    return {names[k]: v for k, v in security.items() if k in names}


def end_offsets(bootstrap: str, topic: str, timeout_s: float = 60, security: dict | None = None
                ) -> dict[int, tuple[int, int]]:
    """partition -> (log start offset, high watermark). Retried while a leader has just moved
    (the consumer's metadata may still name the old one)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    # read_uncommitted: librdkafka's default, read_committed, would answer the last stable offset,
    # and a read up to it could not tell that a transaction was left open
    c = Consumer({"bootstrap.servers": bootstrap, **(security or {}), "group.id": "oncelog-verify", "log_level": 3,
                  "isolation.level": "read_uncommitted"})
    try:
        def ends() -> dict[int, tuple[int, int]]:
            parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in parts}
        return retried(ends, KafkaException, timeout_s, 0.5)
    finally:
        c.close()


def retried(fn: Callable[[], T], errors: type[BaseException] | tuple[type[BaseException], ...], timeout_s: float,
            backoff_s: float) -> T:
    """fn(), again after `backoff_s` while it raises one of `errors` (a leader that just moved),
    until `timeout_s` passed; then that error."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except errors:
            if time.monotonic() > deadline:
                raise
            time.sleep(backoff_s)


def read_range(bootstrap: str, topic: str, stop: dict[int, int] | None = None, timeout_s: float = 120,
               security: dict | None = None, isolation: str = "read_committed",
               unread: set[int] | None = None) -> tuple[dict[int, list[tuple[int, bytes]]], dict[int, int]]:
    """Every partition of `topic` from its log start to `stop` (default: its end offset now).
    Returns (partition -> [(offset, value)], partition -> the offset read up to). A partition
    is read once a record at or past its end came, or the consumer reached its end: the last
    offsets may be transaction markers, which no consumer returns. With `unread` given, partitions
    not read to their end in `timeout_s` are added to it (read_committed stops at a transaction
    left open) instead of raising TimeoutError."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    marks = end_offsets(bootstrap, topic, security=security)
    ends = {p: (stop or {}).get(p, hw) for p, (_lo, hw) in marks.items()}
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in marks}
    todo = {p for p in marks if ends[p] > marks[p][0]}
    c = Consumer({"bootstrap.servers": bootstrap, **(security or {}), "group.id": "oncelog-verify", "log_level": 3,
                  "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation})
    try:
        c.assign([TopicPartition(topic, p, marks[p][0]) for p in todo])
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                p, offset = m.partition(), m.offset()
                err = m.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    if offset is not None and p in todo and offset >= ends[p]:
                        todo.discard(p)
                    continue
                if err or offset is None or p not in todo or offset >= ends[p]:
                    continue
                out[p].append((offset, m.value()))  # type: ignore[arg-type]  # verify writes no null values
                if offset + 1 >= ends[p]:
                    todo.discard(p)
        if todo and unread is None:
            raise TimeoutError(f"could not read partitions {sorted(todo)} of {topic} to their end")
        if unread is not None:
            unread.update(todo)
        return out, ends
    finally:
        c.close()
