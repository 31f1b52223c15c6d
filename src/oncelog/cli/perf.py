"""`oncelog perf produce`: kafka-producer-perf-test's flags and final line, for the oncelog producer.

`--proxy-latency-ms N` puts a delay proxy (N/2 ms each way, so N ms of round trip) in front of
every broker and routes the producer through it, to emulate a long link (KIP-1269's use case).
The minimal delay proxy below runs as a separate process so that it does not share the
producer's interpreter (VERIFY's `oncelog.testing.fault_proxy` adds faults; this one only delays).
"""
from __future__ import annotations

import array
import asyncio
from functools import partial
import os
import socket
import subprocess
import sys
import time

import click


# ---------------------------------------------------------------------------- delay proxy

class DelayProxy:
    """TCP proxy that holds every chunk `delay_ms` before forwarding it, in both directions.
    Byte order is kept (equal delays, FIFO timers); bandwidth is not limited."""

    def __init__(self, target: tuple[str, int], delay_ms: float, listen: tuple[str, int] = ("127.0.0.1", 0)):
        self.target = target
        self.delay = delay_ms / 1000
        self.listen = listen
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._client, *self.listen)
        return self.server.sockets[0].getsockname()[:2]

    async def _client(self, creader, cwriter) -> None:
        try:
            breader, bwriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.close()
            return
        for s in (cwriter, bwriter):
            sock = s.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pipe(creader, bwriter), self._pipe(breader, cwriter),
                             return_exceptions=True)

    async def _pipe(self, reader, writer) -> None:
        loop = asyncio.get_running_loop()

        def write(data):
            if not writer.is_closing():
                writer.write(data)
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                if self.delay > 0:
                    loop.call_later(self.delay, write, data)
                else:
                    writer.write(data)
                if writer.transport.get_write_buffer_size() > 64 << 20:
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            loop.call_later(self.delay, writer.close)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def _proxy_main(target: str, delay_ms: float, listen_port: int) -> None:
    host, _, port = target.rpartition(":")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def main():
        p = DelayProxy((host, int(port)), delay_ms, ("127.0.0.1", listen_port))
        addr = await p.start()
        print(f"proxy listening on {addr[0]}:{addr[1]}", flush=True)
        await asyncio.Event().wait()
    asyncio.run(main())


class ProxyProcess:
    """A delay proxy in a child process; `.address` is "127.0.0.1:port"."""

    def __init__(self, target: str, delay_ms: float, listen_port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from oncelog.cli.perf import _proxy_main; "
             "_proxy_main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))",
             target, str(delay_ms), str(listen_port)],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("proxy listening on "):
            self.stop()
            raise RuntimeError(f"delay proxy did not start: {line!r}")
        self.address = line.strip().rsplit(" ", 1)[1]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------------------- the perf test

def parse_props(props) -> dict:
    out = {}
    for p in props:
        if "=" not in p:
            raise click.BadParameter(f"expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def percentiles(latencies: array.array, count: int) -> tuple[int, int, int, int]:
    s = sorted(latencies[:count])
    if not s:
        return 0, 0, 0, 0
    pick = [s[min(len(s) - 1, int(len(s) * q))] for q in (0.5, 0.95, 0.99, 0.999)]
    return tuple(pick)  # type: ignore[return-value]


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
    proxies: list[ProxyProcess] = []
    if proxy_latency_ms > 0:
        brokers = asyncio.run(_brokers(props["bootstrap.servers"]))
        mapping = {}
        for host, port in brokers:
            px = ProxyProcess(f"{host}:{port}", proxy_latency_ms / 2)
            proxies.append(px)
            mapping[f"{host}:{port}"] = px.address
        props["bootstrap.servers"] = proxies[0].address
        props["oncelog.address.map"] = ",".join(f"{k}={v}" for k, v in mapping.items())
    payload = payload if payload is not None else os.urandom(record_size)
    latencies = array.array("i", bytes(4 * num_records))
    errors = []
    done = [0]
    try:
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
        raise click.ClickException(f"{len(errors)}+ records failed, first: {errors[0]}")
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


@click.group("perf")
def perf() -> None:
    """Performance tests (kafka-*-perf-test compatible)."""


@perf.command("produce", context_settings={"ignore_unknown_options": True})
@click.option("--topic", required=True)
@click.option("--num-records", type=int, required=True)
@click.option("--record-size", type=int, default=None)
@click.option("--payload-file", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--throughput", type=float, required=True, help="records/sec cap; -1 for none")
@click.option("--producer-props", multiple=True, help="k=v ... producer settings")
@click.option("--producer.config", "producer_config", type=click.Path(exists=True), default=None)
@click.option("--bootstrap-server", default=None)
@click.option("--transactional-id", default=None, help="accepted for compatibility; ignored")
@click.option("--proxy-latency-ms", type=float, default=0.0,
              help="route through a delay proxy adding this round-trip time")
@click.option("--no-progress", is_flag=True)
@click.argument("more_props", nargs=-1)
def produce(topic, num_records, record_size, payload_file, throughput, producer_props,
            producer_config, bootstrap_server, transactional_id, proxy_latency_ms, no_progress,
            more_props):
    """Like kafka-producer-perf-test: --topic T --num-records N --record-size S --throughput -1
    --producer-props bootstrap.servers=HOST:PORT acks=all ..."""
    props: dict = {}
    if producer_config:
        with open(producer_config) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    props[k.strip()] = v.strip()
    # kafka-producer-perf-test takes `--producer-props k=v k=v ...`: the values after the first
    # arrive here as extra arguments
    props.update(parse_props(_split(producer_props) + list(more_props)))
    if bootstrap_server:
        props["bootstrap.servers"] = bootstrap_server
    if "bootstrap.servers" not in props:
        raise click.UsageError("give bootstrap.servers in --producer-props or --bootstrap-server")
    payload = None
    if payload_file:
        with open(payload_file, "rb") as f:
            payload = f.read().split(b"\n")[0]
        record_size = len(payload)
    if record_size is None:
        raise click.UsageError("--record-size or --payload-file is required")
    r = run_produce(topic, num_records, record_size, throughput, props,
                    proxy_latency_ms=proxy_latency_ms, progress=not no_progress, payload=payload)
    click.echo(r["line"])


def _split(values) -> list[str]:
    out = []
    for v in values:
        out.extend(v.split())
    return out


if __name__ == "__main__":  # pragma: no cover
    perf()
