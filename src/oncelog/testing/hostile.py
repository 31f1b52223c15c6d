"""Hostile producers, for tests/broker/test_hostile_producers.py and bench/hostile_producers.py:
Produce requests pipelined on one connection from producer ids a broker never saw, or from ids
chosen to share one slot of the public hash oncelog's producer-state table used before issue 13,
and the broker's CPU time read from /proc (no psutil)."""
from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Iterable

from oncelog.protocol import headers
from oncelog.protocol import produce as wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.records import Record, encode_batch

PUBLIC_HASH_MULTIPLIER = 0x9E3779B97F4A7C15  # pid * this >> (64 - bits): the old home slot
_M64 = (1 << 64) - 1
PRODUCE_VERSION = 9  # flexible, topic by name, LogStartOffset and ErrorMessage in the answer


def colliding_producer_ids(n: int) -> list[int]:
    """`n` non-negative int64 producer ids whose products with the public multiplier are 1, 2, 3...:
    all share home slot 0 at every table size, so with linear probing the k-th costs k probes."""
    inverse = pow(PUBLIC_HASH_MULTIPLIER, -1, 1 << 64)
    ids: list[int] = []
    i = 1
    while len(ids) < n:
        pid = (inverse * i) & _M64
        if pid < 2**63:
            ids.append(pid)
        i += 1
    return ids


def idempotent_batch(producer_id: int, sequence: int, epoch: int = 0, records: int = 1) -> bytearray:
    return encode_batch([Record(i, 1_700_000_000_000, None, b"h%d" % i, ()) for i in range(records)],
                        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


def plain_batches(count: int, records: int = 1) -> bytearray:
    """`count` non-idempotent batches in one record set (what a fill of the log sends)."""
    one = encode_batch([Record(i, 1_700_000_000_000, None, b"fill", ()) for i in range(records)])
    return one * count


class PipelinedProducer:
    """Produce requests for one partition, up to `window` in flight on one connection; the broker
    answers in order, so answers line up with the record sets given."""

    def __init__(self, host: str, port: int, topic: str, partition: int = 0, acks: int = 1,
                 window: int = 256) -> None:
        self.host, self.port, self.topic, self.partition = host, port, topic, partition
        self.acks, self.window = acks, window
        self._ids = 0

    async def produce(self, record_sets: Iterable[bytes]) -> list[wire.PartitionResponse]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        answers: list[wire.PartitionResponse] = []
        try:
            pending = 0
            for records in record_sets:
                self._ids += 1
                body = wire.encode_request(PRODUCE_VERSION, self.acks, 30000,
                                           {self.topic: [(self.partition, records)]})
                msg = headers.request_header(ApiKey.PRODUCE, PRODUCE_VERSION, self._ids, "hostile") + body
                writer.write(struct.pack(">i", len(msg)) + msg)
                pending += 1
                if pending >= self.window:
                    await writer.drain()
                    answers.append(await self._answer(reader))
                    pending -= 1
            await writer.drain()
            for _ in range(pending):
                answers.append(await self._answer(reader))
        finally:
            writer.close()
            await writer.wait_closed()
        return answers

    async def _answer(self, reader) -> wire.PartitionResponse:
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        buf = await reader.readexactly(size)
        pos = headers.response_header_size(ApiKey.PRODUCE, PRODUCE_VERSION, buf)
        return wire.decode_response(PRODUCE_VERSION, buf, pos)[0].partitions[0]


def produce(bootstrap: str, topic: str, record_sets: Iterable[bytes], **kw) -> list[wire.PartitionResponse]:
    host, port = bootstrap.rsplit(":", 1)
    return asyncio.run(PipelinedProducer(host, int(port), topic, **kw).produce(record_sets))


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
