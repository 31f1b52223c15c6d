"""The producer performance test behind `oncelog perf produce` and bench/: kafka-producer-perf-test's
loop and final line, for the oncelog producer.

Transactions as Kafka's ProducerPerformance has them (since KAFKA-16900): on when a transactional id is given
(`--transactional-id` or `transactional.id` in the properties) or `--transaction-duration-ms` is;
the id defaults to `performance-producer-<uuid>`, the duration to 3000 ms; a transaction begins
with the first record after a commit and is committed after the send that finds it at least the
duration old, and the last one after the loop. As there, "records sent" counts the records
whose delivery succeeded, and the rate and latencies are theirs.

`proxy_latency_ms` puts a delay proxy (half of it each way, so that much round trip) in front of
every broker and routes the producer through it, to emulate a long link (KIP-1269's use case).
The proxy runs in a child process so that it does not share the producer's interpreter.
"""
from __future__ import annotations

import array
import asyncio
import os
import time
import uuid
from functools import partial

from oncelog.testing.fault_proxy import FaultConfig, FaultProxyProcess

DEFAULT_TRANSACTION_ID_PREFIX = "performance-producer-"
DEFAULT_TRANSACTION_DURATION_MS = 3000


class PerfError(Exception):
    """Records failed during the run (`figures`: the run's, counting delivered records), or a
    transaction could not be committed (`figures` None)."""

    def __init__(self, message: str, figures: dict | None = None) -> None:
        super().__init__(message)
        self.figures = figures


def transaction_settings(props: dict, transactional_id: str | None,
                         transaction_duration_ms: int | None) -> tuple[dict, int | None]:
    """Kafka's ConfigPostProcessor: the producer properties to use and the transaction duration
    (None: no transactions). `transactional_id` takes precedence over `transactional.id`."""
    if transaction_duration_ms is not None and transaction_duration_ms <= 0:
        raise ValueError("--transaction-duration-ms should be greater than zero")
    if transaction_duration_ms is None and transactional_id is None and "transactional.id" not in props:
        return props, None
    props = dict(props)
    props["transactional.id"] = (transactional_id or props.get("transactional.id")
                                 or DEFAULT_TRANSACTION_ID_PREFIX + str(uuid.uuid4()))
    return props, (DEFAULT_TRANSACTION_DURATION_MS if transaction_duration_ms is None
                   else transaction_duration_ms)


def percentiles(latencies: array.array, count: int) -> tuple[int, int, int, int]:
    s = sorted(latencies[:count])
    if not s:
        return 0, 0, 0, 0
    pick = [s[min(len(s) - 1, int(len(s) * q))] for q in (0.5, 0.95, 0.99, 0.999)]
    return pick[0], pick[1], pick[2], pick[3]


def final_line(n: int, elapsed_s: float, record_size: int, latencies: array.array) -> str:
    rate = n / elapsed_s if elapsed_s > 0 else 0.0
    mb = rate * record_size / (1024 * 1024)
    lat = latencies[:n]
    avg = sum(lat) / len(lat) if len(lat) else 0.0
    mx = max(lat) if len(lat) else 0
    p50, p95, p99, p999 = percentiles(latencies, n)
    return (f"{n} records sent, {rate:f} records/sec ({mb:.2f} MB/sec), {avg:.2f} ms avg latency, "
            f"{float(mx):.2f} ms max latency, {p50} ms 50th, {p95} ms 95th, {p99} ms 99th, "
            f"{p999} ms 99.9th.")


def run_produce(topic: str, num_records: int, record_size: int, throughput: float, props: dict,
                *, proxy_latency_ms: float = 0, progress: bool = True, payload: bytes | None = None,
                transactional_id: str | None = None, transaction_duration_ms: int | None = None
                ) -> dict:
    """Run the test; returns the figures (also used by bench/inflight.py). Raises PerfError
    after the run if records failed (the figures are then in its `figures`)."""
    from oncelog.client import Producer

    props, txn_ms = transaction_settings(props, transactional_id, transaction_duration_ms)
    proxies: list[FaultProxyProcess] = []
    payload = payload if payload is not None else os.urandom(record_size)
    latencies = array.array("i", bytes(4 * num_records))
    errors: list[BaseException] = []
    ok = [0]
    failed = [0]
    transactions = 0
    try:
        if proxy_latency_ms > 0:
            mapping = {}
            delay = FaultConfig(latency_ms_up=proxy_latency_ms / 2, latency_ms_down=proxy_latency_ms / 2)
            for host, port in asyncio.run(_brokers(props["bootstrap.servers"])):
                proxy = FaultProxyProcess(f"{host}:{port}", delay)
                proxy.start()
                proxies.append(proxy)
                mapping[f"{host}:{port}"] = proxies[-1].bootstrap
            props["bootstrap.servers"] = proxies[0].bootstrap
            props["oncelog.address.map"] = ",".join(f"{k}={v}" for k, v in mapping.items())
        with Producer(props) as producer:
            if txn_ms is None:
                producer.send(topic, payload).result(60)   # metadata, producer id, first window
            else:
                # no record outside the run (a read_committed reader counts exactly N)
                producer.init_transactions()
                producer.partitions_for(topic)
            start = time.monotonic()

            sent = array.array("d", bytes(8 * num_records))
            clock = time.monotonic

            def delivered(i, err, meta):
                if err is None:
                    latencies[ok[0]] = int((clock() - sent[i]) * 1000)
                    ok[0] += 1
                else:
                    failed[0] += 1
                    if len(errors) < 5:
                        errors.append(err)

            prog = _progress(num_records) if progress else None
            last_ui = start
            send = producer.send
            txn_s = None if txn_ms is None else txn_ms / 1000
            txn_start = 0.0
            in_txn = 0
            for i in range(num_records):
                if txn_s is not None and in_txn == 0:
                    producer.begin_transaction()
                    txn_start = clock()
                now = sent[i] = clock()
                send(topic, payload, on_delivery=partial(delivered, i))
                if txn_s is not None:
                    in_txn += 1
                    if txn_s <= now - txn_start:
                        _commit(producer)
                        transactions += 1
                        in_txn = 0
                if throughput > 0:
                    ahead = (i + 1) / throughput - (now - start)
                    if ahead > 0.001:
                        time.sleep(ahead)
                if prog is not None and now - last_ui > 0.2:
                    prog[0].update(prog[1], completed=ok[0] + failed[0])
                    last_ui = now
            if in_txn:
                _commit(producer)
                transactions += 1
            producer.flush()
            elapsed = time.monotonic() - start
            if prog is not None:
                prog[0].update(prog[1], completed=ok[0] + failed[0])
                prog[0].stop()
            window = producer.partition_window(topic, 0)
            requests = producer.aio.requests_sent
    finally:
        for px in proxies:
            px.stop()
    n = ok[0]
    rate = n / elapsed
    figures = {"records": n, "failed": failed[0], "elapsed_s": elapsed, "records_per_sec": rate,
               "mb_per_sec": rate * record_size / 1048576,
               "line": final_line(n, elapsed, record_size, latencies),
               "window": window, "requests": requests, "transactions": transactions}
    if errors:
        raise PerfError(f"{failed[0]} records failed, first: {errors[0]}", figures)
    return figures


def _commit(producer) -> None:
    from oncelog.client.errors import TransactionAbortableError
    try:
        producer.commit_transaction()
    except TransactionAbortableError as e:
        # Kafka's tool dies here; the run cannot go on in a transaction that must be aborted
        producer.abort_transaction()
        raise PerfError(f"commit_transaction failed ({e}); the transaction was aborted") from e


async def _brokers(bootstrap: str) -> list[tuple[str, int]]:
    from oncelog.client.aio.cluster import Cluster
    c = Cluster(bootstrap)
    try:
        info = await c.refresh([])
        return [(b.host, b.port) for b in info.brokers.values()]
    finally:
        c.close()


def _progress(total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    p = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                 TimeElapsedColumn(), transient=True)
    p.start()
    return p, p.add_task("producing", total=total)
