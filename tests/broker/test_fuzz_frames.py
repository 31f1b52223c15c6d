"""Random and mutated frames against a real broker: it never crashes, never lets a corrupt batch
into the log, and what it acknowledged before is untouched afterwards."""
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_input import produce_one, still_serves
from tests.tiers import examples

from oncelog.protocol import api_versions, headers, init_producer_id, metadata, produce
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("fuzz") / "data",
                      {"auto.create.topics.enable": "false"}).start()
    from oncelog.client import AdminClient
    with AdminClient({"bootstrap.servers": b.bootstrap}) as admin:
        for created in admin.create_topics(["guard", "fuzz"]).values():
            created.result()
    for i in range(5):
        batch = encode_batch([Record(j, 1000, None, b"guard-%d-%d" % (i, j), []) for j in range(3)])
        assert produce_one(b.bootstrap, "guard", batch).base_offset == 3 * i
    yield b
    b.stop()


def valid_requests():
    batch = encode_batch([Record(0, 1000, b"k", b"fuzzed value", [])], producer_id=1000,
                         producer_epoch=0, base_sequence=0)
    return [
        (0, 9, produce.encode_request(9, -1, 1000, {"fuzz": [(0, batch)]})),
        (0, 3, produce.encode_request(3, 1, 1000, {"fuzz": [(0, batch)]})),
        (3, 12, metadata.encode_request(12, ["fuzz"])),
        (3, 1, metadata.encode_request(1, ["fuzz"])),
        (18, 3, api_versions.encode_request(3)),
        (22, 4, init_producer_id.encode_request(4)),
    ]


VALID = valid_requests()


def exchange(boot, frame: bytes) -> None:
    """Send one frame; read an answer or the close, whichever the broker chooses."""
    s = RawConnection(boot, timeout_s=5).sock
    try:
        s.sendall(frame)
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass
    except (TimeoutError, ConnectionError):
        pass
    finally:
        s.close()


def framed(api_key, version, body, corr=7):
    hdr = headers.request_header(api_key, version, corr, "fuzz")
    return struct.pack(">i", len(hdr) + len(body)) + hdr + body


@st.composite
def mutated(draw):
    api_key, version, body = draw(st.sampled_from(VALID))
    frame = bytearray(framed(api_key, version, body))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert"]))
        pos = draw(st.integers(4, len(frame) - 1))
        if kind == "flip":
            frame[pos] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del frame[pos:]
            struct.pack_into(">i", frame, 0, len(frame) - 4)
            if len(frame) <= 4:
                break
        else:
            frame[pos:pos] = draw(st.binary(min_size=1, max_size=8))
            struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


@settings(max_examples=examples(120), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(mutated(), st.binary(min_size=0, max_size=300).map(
    lambda b: struct.pack(">i", len(b)) + b)))
def test_fuzzed_frames_never_crash_or_corrupt(fuzz_broker, frame):
    exchange(fuzz_broker.bootstrap, frame)
    assert fuzz_broker.running, fuzz_broker.log_tail()


def test_after_fuzzing_the_log_is_whole(fuzz_broker):
    assert still_serves(fuzz_broker.bootstrap)
    from oncelog.client import Consumer, TopicPartition
    for topic in ("guard", "fuzz"):
        with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": fuzz_broker.bootstrap}) as c:
            end = c.end_offsets([TopicPartition(topic, 0)])
            c.assign([TopicPartition(topic, 0, 0)])
            got = []
            n = list(end.values())[0]
            while len(got) < n:
                batch = c.poll(5)
                assert batch, f"{topic}: read {len(got)} of {n}"
                got += batch
        assert [r.offset for r in got] == list(range(n))
        if topic == "guard":
            assert [r.value for r in got] == [b"guard-%d-%d" % (i, j) for i in range(5) for j in range(3)]
        else:
            assert all(r.value == b"fuzzed value" for r in got)
