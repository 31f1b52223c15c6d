"""Fetch answers sent from the log files: on PLAINTEXT the records go out with os.sendfile, over
TLS they are read once; both answers are byte for byte what the answer built from the log's bytes
is, for one and several partitions, read_uncommitted and read_committed, flexible and not, and
when the socket takes only part of an answer at once (the rest goes through the transport, in
order). `send_direct` on a socket pair shows the same without a broker."""
from __future__ import annotations

import asyncio
import datetime
import os
import socket
import ssl
import time

import pytest
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.create_topics.v7.response import CreateTopicsResponse
from kio.schema.types import TopicName
from kio.static.primitive import i16, i32, i32Timedelta
from test_dedup_raw import Client, Conn, produce_body

from oncelog.broker.config import BrokerConfig
from oncelog.broker.net.connection import send_direct
from oncelog.protocol import fetch as fetch_wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage.segment import FileRegion
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import request_frame, response_body
from oncelog.testing.tls import make_pki

NOW = int(time.time() * 1000)   # retention must not take the segments
TOPIC = "sendfile"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def broker(tmp_path):
    pki = make_pki(tmp_path / "pki")
    config = BrokerConfig({"log.dirs": str(tmp_path / "data"), "node.id": "1",
                           "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                           "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL",
                           "ssl.keystore.location": str(pki.broker_pem()),
                           "log.segment.bytes": "300000"})
    b = InProcessBroker(config)
    await b.start()
    host, port = b.bound["PLAINTEXT"]
    plain = Client(await Conn.open(host, port))
    req = ct_req.CreateTopicsRequest(topics=(ct_req.CreatableTopic(
        name=TopicName(TOPIC), num_partitions=i32(2), replication_factor=i16(1), assignments=(), configs=()),),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), validate_only=False)
    assert (await plain.conn.kio(req, CreateTopicsResponse)).topics[0].error_code.value == 0
    for i in range(60):   # batches of 1 to 40 KB over a few segments, on both partitions
        records = encode_batch([Record(j, NOW, None, os.urandom(100 + (i * 977) % 9000), [])
                                for j in range(1 + i % 4)])
        body = await plain.conn.raw(0, 9, produce_body(9, TOPIC, i % 2, records), True)
        assert body
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    tls_host, tls_port = b.bound["SSL"]
    tls = Conn(*await asyncio.open_connection(tls_host, tls_port, ssl=ctx, server_hostname="localhost"))
    yield b, plain.conn, tls
    await plain.conn.close()
    await tls.close()
    await b.stop()


def fetch_request(version: int, offsets: dict[int, int], max_bytes: int, partition_max_bytes: int,
                  isolation: int = 0) -> bytes:
    rq = RequestBuilder(ApiKey.FETCH, version)
    return rq.encode(replica_id=-1, max_wait=0, min_bytes=0, max_bytes=max_bytes, isolation_level=isolation,
                     session_id=0, session_epoch=-1, topics=(rq("FetchTopic", topic=TOPIC, partitions=tuple(
                         rq("FetchPartition", partition=p, current_leader_epoch=-1, fetch_offset=o,
                            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=partition_max_bytes)
                         for p, o in offsets.items())),),
                     forgotten_topics_data=(), rack_id="")


def expected(b: InProcessBroker, version: int, offsets: dict[int, int], max_bytes: int,
             partition_max_bytes: int, committed: bool) -> tuple[bytes, int]:
    """The answer built from the log's bytes (`Partition.read`), as the Fetch handler budgets it,
    and how many bytes of records it holds."""
    parts, budget, total = [], max_bytes, 0
    for index, offset in offsets.items():
        p = b.logs.get_partition(TOPIC, index)
        limit = min(partition_max_bytes, budget)
        first = total == 0
        records = p.read(offset, limit, min_one=first, max_offset=p.last_stable_offset) \
            if limit > 0 or first else b""
        parts.append(fetch_wire.PartitionData(index, 0, p.high_watermark, p.log_start_offset, records,
                                              p.last_stable_offset, [] if committed else None))
        total += len(records)
        budget = max(0, budget - len(records))
    return fetch_wire.encode_response(version, [(TOPIC, parts)]), total


CASES = [({0: 0}, 1 << 20, 1 << 20), ({0: 5, 1: 0}, 1 << 20, 30_000), ({1: 17}, 1, 1),
         ({0: 40, 1: 40}, 50_000, 1 << 20), ({0: 0, 1: 0}, 100_000, 100), ({0: 59}, 1 << 20, 1 << 20)]


async def test_plaintext_sendfile_and_tls_answers_are_the_copying_answer(broker, monkeypatch):
    b, plain, tls = broker
    sent = []
    real = os.sendfile

    def counting(*args):
        n = real(*args)
        sent.append(n)
        return n
    monkeypatch.setattr(os, "sendfile", counting)
    for version in (4, 11, 12):
        for committed in (0, 1):
            for offsets, max_bytes, partition_max_bytes in CASES:
                request = fetch_request(version, offsets, max_bytes, partition_max_bytes, committed)
                want, records = expected(b, version, offsets, max_bytes, partition_max_bytes, bool(committed))
                assert records > 100
                before = sum(sent)
                assert await plain.exchange(ApiKey.FETCH, version, request) == want, (version, offsets)
                assert sum(sent) - before == records   # the records went by sendfile
                before = sum(sent)
                assert await tls.exchange(ApiKey.FETCH, version, request) == want, (version, offsets)
                assert sum(sent) == before                     # over TLS they were read


async def test_an_answer_the_socket_takes_only_in_part_goes_on_through_the_transport(broker):
    """The broker's socket buffer is made small and the client reads nothing until the broker had
    to keep part of a 300 KB answer in its transport: the bytes that arrive are the answer."""
    b, plain, _tls = broker
    host, port = b.bound["PLAINTEXT"]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    slow = Conn(*await asyncio.open_connection(sock=sock, limit=1024))
    version, offsets = 12, {0: 0, 1: 0}
    request = fetch_request(version, offsets, 1 << 20, 1 << 20)
    want = await plain.exchange(ApiKey.FETCH, version, request)   # the answer as sent whole
    assert len(want) > 200_000
    deadline = asyncio.get_running_loop().time() + 30
    theirs = None
    while theirs is None and asyncio.get_running_loop().time() < deadline:   # the broker's side of it
        theirs = next((c for c in b.connections if c.transport.get_extra_info("peername")[1]
                       == sock.getsockname()[1]), None)
        await asyncio.sleep(0.01)
    assert theirs is not None and theirs.sendfile_fd is not None
    theirs.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    slow.writer.transport.pause_reading()   # nothing is read until the broker buffered part of it
    slow.correlation += 1
    slow.writer.write(request_frame(ApiKey.FETCH, version, slow.correlation, request))
    await slow.writer.drain()
    while not theirs.transport.get_write_buffer_size() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert theirs.transport.get_write_buffer_size() > 0
    slow.writer.transport.resume_reading()
    size = int.from_bytes(await slow.reader.readexactly(4), "big")
    assert response_body(ApiKey.FETCH, version, await slow.reader.readexactly(size), slow.correlation) == want
    await slow.close()


def test_send_direct_leaves_what_the_socket_did_not_take_in_order(tmp_path):
    path = tmp_path / "segment"
    data = os.urandom(3 << 20)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    ours.setblocking(False)
    try:
        region = FileRegion(os.dup(fd), 1000, len(data) - 2000, 0)
        parts = [b"head", region, b"tail"]
        left = send_direct(ours.fileno(), parts)
        assert left and region.fd == -1   # the socket took part of it; the rest was read
        ours.setblocking(True)
        sent = bytearray()
        theirs.setblocking(False)
        while True:
            try:
                chunk = theirs.recv(1 << 20)
            except BlockingIOError:
                break
            sent += chunk
        rest = b"".join(bytes(p) for p in left)
        assert bytes(sent) + rest == b"head" + data[1000:-1000] + b"tail"
        # all of it when the socket takes all: nothing left, the region closed
        small = FileRegion(os.dup(fd), 0, 1000, 0)
        assert send_direct(ours.fileno(), [b"x", small]) == [] and small.fd == -1
        assert theirs.recv(2000) == b"x" + data[:1000]
    finally:
        os.close(fd)
        ours.close()
        theirs.close()
