"""A stand-in broker for bench/inflight.py while `oncelog.broker` is not there yet: in memory,
single node, just the APIs an idempotent producer needs (ApiVersions 0-3, Metadata 1-10,
InitProducerId 0-4, Produce 3-14), with deduplication by oncelog's own producer-state core
(`oncelog.core.producer_state`, window mode) and ProduceResponse v14's tag 1.

A topic's window is `producer.state.batches.to.retain`, given per topic name pattern on the command
line (`--window inflight-20=20`), default 5. Topics are created on first Metadata request.
Not a product: no storage, no fetch. It exists so the client-side numbers can be measured.

    python bench/inflight_broker.py --port 0 [--advertise 127.0.0.1:PORT] [--window NAME=N ...]
"""
from __future__ import annotations

import argparse
import asyncio
import secrets
import struct
import time
import uuid

from oncelog.core.producer_state import APPEND, DUPLICATE, ProducerStateConfig, ProducerStateManager
from oncelog.core.sequence import last_sequence_of
from oncelog.protocol.api import ApiKey, is_flexible
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.primitives import Reader, uvarint
from oncelog.protocol.records import iter_batches, patch_batch

I16, I32, I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
VERSIONS = {ApiKey.API_VERSIONS: (0, 3), ApiKey.METADATA: (1, 10), ApiKey.INIT_PRODUCER_ID: (0, 4),
            ApiKey.PRODUCE: (3, 14),
            # advertised, not served: librdkafka only enables message format v2 when a broker
            # lists Fetch v4+ next to Produce v3+ (its MsgVer2 feature)
            ApiKey.FETCH: (4, 12)}


def s16(s: str | None, flex: bool) -> bytes:
    if s is None:
        return b"\x00" if flex else I16.pack(-1)
    b = s.encode()
    return uvarint(len(b) + 1) + b if flex else I16.pack(len(b)) + b


def arr(n: int, flex: bool) -> bytes:
    return uvarint(n + 1) if flex else I32.pack(n)


class Partition:
    def __init__(self, window: int) -> None:
        self.window = window
        # a stand-in broker draws its pid hash key as storage does (per partition, at random)
        self.state = ProducerStateManager(ProducerStateConfig(batches_to_retain=window),
                                          hash_key=secrets.randbits(64))
        self.next_offset = 0
        self.bytes = 0


class StandInBroker:
    """Node 1 serves everything unless `add_old_node` added a second listener: then
    `move_leader(topic, 2)` hands the (shared) partition to node 2, which behaves like a broker
    without KIP-1269 (retains 5 batches, no tag 1), as in KIP-1269's leader-change test."""

    def __init__(self, advertise: tuple[str, int] | None, windows: dict[str, int]) -> None:
        self.advertise = advertise
        self.windows = windows
        self.topics: dict[str, tuple[uuid.UUID, Partition]] = {}
        self.by_id: dict[uuid.UUID, str] = {}
        self.next_pid = 1000
        self.nodes: dict[int, tuple[str, int]] = {}
        self.old_nodes: set[int] = set()
        self.leaders: dict[str, int] = {}
        self.leader_epochs: dict[str, int] = {}

    async def start_node(self, node: int, port: int = 0, old: bool = False) -> tuple[str, int]:
        server = await asyncio.start_server(lambda r, w: self.client(r, w, node), "127.0.0.1", port)
        addr = server.sockets[0].getsockname()[:2]
        self.nodes[node] = addr
        if old:
            self.old_nodes.add(node)
        return addr

    def move_leader(self, topic: str, node: int) -> None:
        self.leaders[topic] = node
        self.leader_epochs[topic] = self.leader_epochs.get(topic, 0) + 1
        p = self.topic(topic)[1]
        window = 5 if node in self.old_nodes else self.windows.get(topic, 5)
        p.window = window
        p.state.reconfigure(ProducerStateConfig(batches_to_retain=window))

    def topic(self, name: str):
        t = self.topics.get(name)
        if t is None:
            window = next((w for prefix, w in self.windows.items() if name == prefix), 5)
            t = self.topics[name] = (uuid.uuid4(), Partition(window))
            self.by_id[t[0]] = name
        return t

    async def serve(self, port: int) -> None:
        server = await asyncio.start_server(self.client, "127.0.0.1", port)
        host, bound = server.sockets[0].getsockname()[:2]
        self.nodes[1] = (host, bound)
        if self.advertise is None:
            self.advertise = (host, bound)
        print(f"oncelog: listening on {host}:{bound}", flush=True)
        async with server:
            await server.serve_forever()

    async def client(self, reader, writer, node: int = 1) -> None:
        try:
            while True:
                size = I32.unpack(await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                out = self.handle(frame, node)
                if out is not None:
                    writer.write(I32.pack(len(out)) + out)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def handle(self, frame: bytes, node: int = 1) -> bytes | None:
        r = Reader(frame)
        key, version, corr = r.i16(), r.i16(), r.i32()
        r.string(False)
        flex = is_flexible(key, version)
        if flex:
            r.skip_tags()
        head = I32.pack(corr) + (b"\x00" if flex and key != ApiKey.API_VERSIONS else b"")
        if key == ApiKey.API_VERSIONS:
            return head + self.api_versions(version)
        if key == ApiKey.METADATA:
            return head + self.metadata(version, r)
        if key == ApiKey.INIT_PRODUCER_ID:
            return head + self.init_pid(version, r)
        if key == ApiKey.PRODUCE:
            body = self.produce(version, r, node)
            return None if body is None else head + body
        return None

    def api_versions(self, version: int) -> bytes:
        flex = version >= 3
        out = [I16.pack(0), arr(len(VERSIONS), flex)]
        for k, (lo, hi) in VERSIONS.items():
            out.append(struct.pack(">hhh", k, lo, hi) + (b"\x00" if flex else b""))
        if version >= 1:
            out.append(I32.pack(0))
        if flex:
            out.append(b"\x00")
        return b"".join(out)

    def metadata(self, v: int, r: Reader) -> bytes:
        flex = v >= 9
        n = r.array_len(flex)
        names = []
        for _ in range(max(n, 0)):
            if v >= 10:
                r.uuid()
            names.append(r.string(flex))
            if flex:
                r.skip_tags()
        if n < 0:
            names = list(self.topics)
        tag = b"\x00" if flex else b""
        nodes = self.nodes or {1: self.advertise}
        if self.advertise is not None and 1 in nodes:
            nodes = {**nodes, 1: self.advertise}
        out = [I32.pack(0) if v >= 3 else b"", arr(len(nodes), flex)]
        for nid, (host, port) in sorted(nodes.items()):
            out.append(I32.pack(nid) + s16(host, flex) + I32.pack(port) + s16(None, flex) + tag)
        if v >= 2:
            out.append(s16("standin", flex))
        out.append(I32.pack(1))
        out.append(arr(len(names), flex))
        for name in names:
            tid, _p = self.topic(name)
            out.append(I16.pack(0) + s16(name, flex) + (tid.bytes if v >= 10 else b"") + b"\x00")
            leader = self.leaders.get(name, 1)
            out.append(arr(1, flex) + I16.pack(0) + I32.pack(0) + I32.pack(leader))
            if v >= 7:
                out.append(I32.pack(self.leader_epochs.get(name, 0)))
            out.append(arr(1, flex) + I32.pack(leader) + arr(1, flex) + I32.pack(leader))
            if v >= 5:
                out.append(arr(0, flex))
            out.append(tag)
            if v >= 8:
                out.append(I32.pack(-2147483648))
            out.append(tag)
        if 8 <= v <= 10:
            out.append(I32.pack(-2147483648))
        out.append(tag)
        return b"".join(out)

    def init_pid(self, v: int, r: Reader) -> bytes:
        flex = v >= 2
        r.string(flex)
        r.i32()
        pid, epoch = (r.i64(), r.i16()) if v >= 3 else (-1, -1)
        if pid >= 0:
            epoch += 1
        else:
            pid, epoch = self.next_pid, 0
            self.next_pid += 1
        return I32.pack(0) + I16.pack(0) + I64.pack(pid) + I16.pack(epoch) + (b"\x00" if flex else b"")

    def produce(self, v: int, r: Reader, node: int = 1) -> bytes | None:
        flex = v >= 9
        r.string(flex)
        acks = r.i16()
        r.i32()
        now = int(time.time() * 1000)
        topics = []
        for _ in range(r.array_len(flex)):
            if v >= 13:
                tid = r.uuid()
                name = self.by_id.get(tid)
            else:
                name = tid = r.string(flex)
            parts = []
            for _ in range(r.array_len(flex)):
                idx = r.i32()
                records = r.bytes_(flex)
                if flex:
                    r.skip_tags()
                if name is not None and self.leaders.get(name, 1) != node:
                    parts.append((idx, (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)))
                else:
                    parts.append((idx, self.append(name, records, now)))
            if flex:
                r.skip_tags()
            topics.append((tid, name, parts))
        if acks == 0:
            return None
        out = [arr(len(topics), flex)]
        for tid, name, parts in topics:
            out.append(tid.bytes if v >= 13 else s16(tid, flex))
            out.append(arr(len(parts), flex))
            for idx, (err, base) in parts:
                out.append(I32.pack(idx) + I16.pack(err) + I64.pack(base) + I64.pack(-1))
                if v >= 5:
                    out.append(I64.pack(0))
                if v >= 8:
                    out.append(arr(0, flex) + s16(None, flex))
                if flex:
                    out.append(b"\x00")
            if flex:
                if v >= 14 and name in self.topics and node not in self.old_nodes:
                    w = I32.pack(self.topics[name][1].window)
                    out.append(b"\x01" + uvarint(1) + uvarint(len(w)) + w)
                else:
                    out.append(b"\x00")
        out.append(I32.pack(0))
        if flex:
            out.append(b"\x00")
        return b"".join(out)

    def append(self, name, records: bytes | None, now: int) -> tuple[int, int]:
        if name is None or name not in self.topics or records is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        p = self.topics[name][1]
        buf = bytearray(records)
        batches = list(iter_batches(buf))
        first = -1
        if not batches or any(h.magic != 2 for _pos, h in batches):
            return ErrorCode.CORRUPT_MESSAGE, -1   # only record batch v2 here
        for pos, h in batches:
            if h.producer_id >= 0:
                c = p.state.check(h.producer_id, h.producer_epoch, h.base_sequence, last_sequence_of(h))
                if c.kind == DUPLICATE:
                    return 0, c.base_offset
                if c.kind != APPEND:
                    return c.error, -1
            else:
                c = None
            base = p.next_offset
            patch_batch(buf, pos, base, 0)
            p.next_offset += h.last_offset_delta + 1
            p.bytes += h.size
            if c is not None:
                p.state.commit(c, base, now, now)
            if first < 0:
                first = base
        return 0, first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--advertise", default=None)
    ap.add_argument("--window", action="append", default=[], help="TOPIC=N")
    a = ap.parse_args()
    adv = None
    if a.advertise:
        h, _, p = a.advertise.rpartition(":")
        adv = (h, int(p))
    windows = {k: int(v) for k, v in (w.split("=", 1) for w in a.window)}
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(StandInBroker(adv, windows).serve(a.port))


if __name__ == "__main__":
    main()
