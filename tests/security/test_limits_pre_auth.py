"""Issue 25, finding 6: the controller port read frames of up to 10 MB before authentication (10
such connections held 100 MB) and let a client try PLAIN passwords as fast as it could (2,056
tries a second), each failure closing at once. Kafka caps every frame before authentication at
`sasl.server.max.receive.size` (512 KB) and closes a connection that failed authentication only
after `connection.failed.authentication.delay.ms` (100 ms), holding that connection, not the
others. Both apply to the controller's listener and, from the settings, to a broker's SASL
listeners.

Written as the attack: raw frames and logins on sockets."""
from __future__ import annotations

import re
import struct
import time

import pytest

from oncelog.core.security.plain import client_token
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.embedded import PASSWORD, USER, BrokerProcess, ControllerProcess
from oncelog.testing.raw_client import RawConnection, request_body, response_body

pytestmark = pytest.mark.processes

DELAY_MS = 4000


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    c = ControllerProcess(tmp_path_factory.mktemp("ctl") / "meta")
    c.overrides = {"connection.failed.authentication.delay.ms": str(DELAY_MS)}
    c.start()
    yield c
    c.stop()


def test_controller_refuses_a_frame_over_the_pre_authentication_cap_from_its_size_alone(controller):
    for size in (10 << 20, 524288 + 1):
        with RawConnection(controller.bootstrap) as c:
            c.send_raw(struct.pack(">i", size))        # the size, none of the bytes it announces
            assert c.closed_within(10), f"a {size}-byte frame before authentication was waited for"
    assert "before authentication is over sasl.server.max.receive.size (524288)" in controller.log_tail()


def test_controller_takes_a_frame_at_the_cap_before_authentication(controller):
    """The cap is Kafka's, not lower: ApiVersions padded to exactly 524288 bytes is answered."""
    with RawConnection(controller.bootstrap) as c:
        header = b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff"        # ApiVersions v0, correlation 1, null client id
        c.send_raw(struct.pack(">i", 524288) + header + b"\0" * (524288 - len(header)))
        assert c.recv_frame()[:4] == b"\x00\x00\x00\x01"


def test_controller_delays_the_answer_to_a_failed_login_and_serves_others_meanwhile(controller):
    """KIP-306: the failure answer itself waits the delay (issue 36: only the close did), then the
    connection closes."""
    with RawConnection(controller.bootstrap) as guesser:
        assert int(guesser.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code) == 0
        started = time.monotonic()
        correlation = guesser.send(ApiKey.SASL_AUTHENTICATE, 2, request_body(
            ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": client_token(USER, "wrong")}))
        # another connection logs in and is served while the failed one waits for its answer
        with RawConnection(controller.bootstrap) as broker:
            assert broker.plain_login(USER, PASSWORD) == 0
            assert broker.api_versions() == 0
        answer = entities.decode_response(ApiKey.SASL_AUTHENTICATE, 2, response_body(
            ApiKey.SASL_AUTHENTICATE, 2, guesser.recv_frame(), correlation))
        assert int(answer.error_code) == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert time.monotonic() - started >= DELAY_MS / 1000, "a failed login was answered before the delay"
        assert guesser.closed_within(5)
    assert re.search(r"SASL/PLAIN authentication failed for 'broker': wrong password \(from 127\.0\.0\.1:\d+\)",
                     controller.log_tail())


def test_controller_delays_the_answer_to_an_unsupported_mechanism(controller):
    with RawConnection(controller.bootstrap) as c:
        started = time.monotonic()
        hs = c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="GSSAPI")
        assert time.monotonic() - started >= DELAY_MS / 1000
        assert int(hs.error_code) == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert list(hs.mechanisms) == ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
        assert c.closed_within(5)


def test_broker_sasl_listener_reads_its_cap_from_sasl_server_max_receive_size(tmp_path):
    users = 'user_alice="alice-secret"'
    with BrokerProcess(tmp_path / "data", {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
            "sasl.server.max.receive.size": "4096"}) as b:
        with RawConnection(b.bootstrap) as c:
            c.send_raw(struct.pack(">i", 4097))
            assert c.closed_within(10), "a frame over sasl.server.max.receive.size was waited for"
        with RawConnection(b.bootstrap) as c:       # after authentication the cap no longer applies
            assert c.plain_login("alice", "alice-secret") == 0
            header = b"\x00\x12\x00\x00\x00\x00\x00\x07\xff\xff"
            c.send_raw(struct.pack(">i", 8192) + header + b"\0" * (8192 - len(header)))
            assert c.recv_frame()[:4] == b"\x00\x00\x00\x07"
        assert "sasl.server.max.receive.size" in b.log_file.read_text()
