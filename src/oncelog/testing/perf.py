"""The producer performance test behind `oncelog perf produce` and bench/: kafka-producer-perf-test's
loop and final line, for the oncelog producer.

`proxy_latency_ms` puts a delay proxy (half of it each way, so that much round trip) in front of
every broker and routes the producer through it, to emulate a long link (KIP-1269's use case).
The proxy runs in a child process so that it does not share the producer's interpreter.
"""
from __future__ import annotations

import array
import asyncio
import os
import time
from functools import partial

from oncelog.testing.fault_proxy import FaultConfig, FaultProxyProcess


class PerfError(Exception):
    """Records failed during the run."""


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
                *, proxy_latency_ms: float = 0, progress: bool = True, payload: bytes | None = None
                ) -> dict:
    """Run the test; returns the figures (also used by bench/inflight.py)."""
    from oncelog.client import Producer

    props = dict(props)
    proxies: list[FaultProxyProcess] = []
    payload = payload if payload is not None else os.urandom(record_size)
    latencies = array.array("i", bytes(4 * num_records))
    errors: list[BaseException] = []
    done = [0]
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
            producer.send(topic, payload).result(60)   # metadata, producer id, first window
            start = time.monotonic()

            sent = array.array("d", bytes(8 * num_records))
            clock = time.monotonic

            def delivered(i, err, meta):
                latencies[i] = int((clock() - sent[i]) * 1000)
                done[0] += 1
                if err is not None and len(errors) < 5:
                    errors.append(err)

            prog = _progress(num_records) if progress else None
            last_ui = start
            send = producer.send
            for i in range(num_records):
                now = sent[i] = clock()
                send(topic, payload, on_delivery=partial(delivered, i))
                if throughput > 0:
                    ahead = (i + 1) / throughput - (now - start)
                    if ahead > 0.001:
                        time.sleep(ahead)
                if prog is not None and now - last_ui > 0.2:
                    prog[0].update(prog[1], completed=done[0])
                    last_ui = now
            producer.flush()
            elapsed = time.monotonic() - start
            if prog is not None:
                prog[0].update(prog[1], completed=done[0])
                prog[0].stop()
            window = producer.partition_window(topic, 0)
            requests = producer.aio.requests_sent
    finally:
        for px in proxies:
            px.stop()
    if errors:
        raise PerfError(f"{len(errors)}+ records failed, first: {errors[0]}")
    rate = num_records / elapsed
    return {"records": num_records, "elapsed_s": elapsed, "records_per_sec": rate,
            "mb_per_sec": rate * record_size / 1048576,
            "line": final_line(num_records, elapsed, record_size, latencies),
            "window": window, "requests": requests}


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
