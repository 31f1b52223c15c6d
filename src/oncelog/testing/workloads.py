"""Workloads: unique values produced by one client (oncelog, librdkafka, kafka-python), every
acknowledgement and error recorded as checker Events, plus what the client says recovery cost
(retries, epoch bumps). `read_range` reads every partition for the checker."""
from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from oncelog.testing.checker import Event

_clock = itertools.count()
_lock = threading.Lock()


def _t() -> int:
    with _lock:
        return next(_clock)


@dataclass
class Workload:
    bootstrap: str
    topic: str
    records: int
    producer: str                        # a name unique in the run; values (and keys) are f"{producer}-{i}"
    rate: float | None = None            # records/s; None = as fast as the client goes
    gate: threading.Event | None = None  # cleared = pause sending (the expiry fault idles producers)
    timeout_s: float = 120
    events: list[Event] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)

    client = "?"

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
            self.events.append(Event(_t(), self.client, self.producer, "send", value))
            yield value


class LibrdkafkaWorkload(Workload):
    client = "librdkafka"

    def run(self) -> None:
        from confluent_kafka import Producer
        last_stats: dict = {}

        def on_stats(raw: str) -> None:
            last_stats.update(json.loads(raw))

        def cb(err, msg) -> None:
            v = msg.value()
            if err is None:
                self.events.append(Event(_t(), self.client, self.producer, "ack", v, msg.partition(), msg.offset()))
            else:
                kind = "fatal" if err.fatal() else "error"
                self.events.append(Event(_t(), self.client, self.producer, kind, v, msg.partition(), None,
                                         err.name()))

        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                      "message.timeout.ms": int(self.timeout_s * 1000), "socket.timeout.ms": 5000,
                      "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 500,
                      "statistics.interval.ms": 500, "stats_cb": on_stats, "log_level": 3})
        from confluent_kafka import KafkaException
        for v in self.values():
            if v is None:
                p.poll(0.05)
                continue
            try:
                while True:
                    try:
                        p.produce(self.topic, v, key=v, on_delivery=cb)
                        break
                    except BufferError:
                        p.poll(0.05)
            except KafkaException as e:  # fatal: the producer takes nothing more
                self.events.append(Event(_t(), self.client, self.producer, "fatal", v, None, None,
                                         e.args[0].name() if e.args else str(e)))
                break
            p.poll(0)
        p.flush(self.timeout_s)
        p.poll(0.6)  # one more statistics callback after the last delivery
        if last_stats:  # librdkafka's own counters, when its statistics callback ran
            brokers = last_stats.get("brokers", {}).values()
            self.stats["retries"] = sum(b.get("txretries", 0) for b in brokers)
            # epoch_cnt counts every id/epoch change, the first InitProducerId included
            self.stats["epoch_bumps"] = max(last_stats.get("eos", {}).get("epoch_cnt", 0) - 1, 0)


class KafkaPythonWorkload(Workload):
    client = "kafka-python"

    def run(self) -> None:
        from kafka import KafkaProducer
        kp = KafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all",
                           linger_ms=5, request_timeout_ms=5000, retry_backoff_ms=20,
                           delivery_timeout_ms=int(self.timeout_s * 1000))
        futs = []
        for v in self.values():
            if v is not None:
                futs.append((v, kp.send(self.topic, v, key=v)))
        try:
            kp.flush(self.timeout_s)
        except Exception:  # what did not make it is on the futures
            pass
        for v, f in futs:
            try:
                md = f.get(timeout=1)
                self.events.append(Event(_t(), self.client, self.producer, "ack", v, md.partition, md.offset))
            except Exception as e:  # the checker records it; unacknowledged is not lost
                kind = "fatal" if _kafka_python_fatal(kp) else "error"
                self.events.append(Event(_t(), self.client, self.producer, kind, v, None, None,
                                         f"{type(e).__name__}: {e}"[:200]))
        metrics = kp.metrics().get("producer-metrics", {})
        self.stats["retries"] = int(metrics.get("record-retry-total", 0))
        kp.close(5)


def _kafka_python_fatal(kp) -> bool:
    tm = getattr(getattr(kp, "_sender", None), "_transaction_manager", None)
    return bool(tm is not None and getattr(tm, "has_fatal_error", lambda: False)())


class OncelogWorkload(Workload):
    client = "oncelog"

    def run(self) -> None:
        from oncelog.client import Producer
        from oncelog.client.errors import ProducerFatalError
        futs = []
        with Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": "required",
                       "delivery.timeout.ms": int(self.timeout_s * 1000)}) as p:
            for v in self.values():
                if v is not None:
                    futs.append((v, p.send(self.topic, v, key=v)))
            try:
                p.flush(self.timeout_s)
            except Exception:  # failures are on the futures
                pass
            for v, f in futs:
                try:
                    md = f.result(self.timeout_s)
                    self.events.append(Event(_t(), self.client, self.producer, "ack", v, md.partition, md.offset))
                except Exception as e:
                    kind = "fatal" if isinstance(e, ProducerFatalError) else "error"
                    self.events.append(Event(_t(), self.client, self.producer, kind, v, None, None,
                                             f"{type(e).__name__}: {e}"[:200]))
            self.stats.update(p.stats)


WORKLOADS: dict[str, type[Workload]] = {"oncelog": OncelogWorkload, "librdkafka": LibrdkafkaWorkload,
                                        "kafka-python": KafkaPythonWorkload}


def end_offsets(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (log start offset, high watermark)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "oncelog-verify", "log_level": 3})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in parts}
    finally:
        c.close()


def read_range(bootstrap: str, topic: str, stop: dict[int, int] | None = None, timeout_s: float = 120
               ) -> tuple[dict[int, list[tuple[int, bytes]]], dict[int, int]]:
    """Every partition of `topic` from its log start to `stop` (default: its end offset now).
    Returns (partition -> [(offset, value)], partition -> the offset read up to)."""
    from confluent_kafka import Consumer, TopicPartition
    marks = end_offsets(bootstrap, topic)
    ends = {p: (stop or {}).get(p, hw) for p, (_lo, hw) in marks.items()}
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in marks}
    todo = {p for p in marks if ends[p] > marks[p][0]}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "oncelog-verify", "log_level": 3,
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, marks[p][0]) for p in todo])
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                p = m.partition()
                if m.error() or p not in todo or m.offset() >= ends[p]:
                    continue
                out[p].append((m.offset(), m.value()))
                if m.offset() + 1 >= ends[p]:
                    todo.discard(p)
        if todo:
            raise TimeoutError(f"could not read partitions {sorted(todo)} of {topic} to their end")
        return out, ends
    finally:
        c.close()


def read_all(bootstrap: str, topic: str, timeout_s: float = 120) -> dict[int, list[tuple[int, bytes]]]:
    return read_range(bootstrap, topic, timeout_s=timeout_s)[0]
