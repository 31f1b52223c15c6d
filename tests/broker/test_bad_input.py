"""Bad input costs only the connection that sent it: the broker stays up, answers the right error
code where the request can be answered, and loses nothing it acknowledged."""
import struct

import pytest

from oncelog.protocol import headers
from oncelog.protocol import produce as produce_codec
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.raw_client import RawConnection


def closed_by_peer(c: RawConnection) -> bool:
    return c.closed_within(10, quietly=True)


def still_serves(boot):
    with RawConnection(boot) as c:
        correlation = c.send(18, 0, b"")
        body = c.recv_frame()
    return struct.unpack(">i", body[:4])[0] == correlation and struct.unpack(">h", body[4:6])[0] == 0


def test_frame_over_socket_request_max_bytes_closes_that_connection_only(broker):
    s = RawConnection(broker.bootstrap)
    s.send_raw(struct.pack(">i", 200 * 1024 * 1024))  # default limit is 100 MiB; nothing follows
    assert closed_by_peer(s)
    assert still_serves(broker.bootstrap)
    assert "socket.request.max.bytes" in broker.log_tail()


def test_negative_frame_size_closes_the_connection(broker):
    s = RawConnection(broker.bootstrap)
    s.send_raw(struct.pack(">i", -5))
    assert closed_by_peer(s)
    assert still_serves(broker.bootstrap)


def test_unknown_api_key_closes_the_connection_with_a_log_line(broker):
    s = RawConnection(broker.bootstrap)
    s.send(999, 0, b"")
    assert closed_by_peer(s)
    assert "unknown API key 999" in broker.log_tail()
    assert still_serves(broker.bootstrap)


def test_truncated_request_body_closes_the_connection(broker):
    s = RawConnection(broker.bootstrap)
    s.send(3, 12, b"\x05\x00")  # Metadata v12 announcing topics it does not carry
    assert closed_by_peer(s)
    assert "malformed" in broker.log_tail()
    assert still_serves(broker.bootstrap)


def test_api_versions_above_ours_gets_unsupported_version_with_our_ranges(broker):
    s = RawConnection(broker.bootstrap)
    s.send(18, 99, b"")
    body = s.recv_frame()
    assert struct.unpack(">i", body[:4])[0] == 1
    assert struct.unpack(">h", body[4:6])[0] == 35  # UNSUPPORTED_VERSION
    count = struct.unpack(">i", body[6:10])[0]
    keys = {struct.unpack(">h", body[10 + 6 * i:12 + 6 * i])[0] for i in range(count)}
    assert {0, 1, 3, 18, 22} <= keys
    s.close()


def produce_one(boot, topic, records, version=9):
    with RawConnection(boot) as s:
        s.send(0, version, produce_codec.encode_request(version, -1, 5000, {topic: [(0, records)]}))
        body = s.recv_frame()
    [t] = produce_codec.decode_response(version, body, headers.response_header_size(0, version, body))
    return t.partitions[0]


@pytest.mark.parametrize("damage", ["crc", "truncated", "count"])
def test_corrupt_batch_gets_corrupt_message_and_appends_nothing(broker, damage):
    from oncelog.client import AdminClient
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics(["t"])["t"].result()
    good = encode_batch([Record(0, 1000, None, b"good", [])])
    assert produce_one(broker.bootstrap, "t", good).error_code == 0
    bad = bytearray(encode_batch([Record(0, 1000, None, b"value", []), Record(1, 1000, None, b"v2", [])]))
    if damage == "crc":
        bad[-1] ^= 0xFF
    elif damage == "truncated":
        bad = bad[:-3]
    else:
        struct.pack_into(">i", bad, 57, 5)  # records count says 5
    p = produce_one(broker.bootstrap, "t", bytes(bad))
    assert p.error_code in (2, 87)  # CORRUPT_MESSAGE / INVALID_RECORD
    assert p.log_start_offset == 0
    assert produce_one(broker.bootstrap, "t", good).base_offset == 1  # nothing half-appended
