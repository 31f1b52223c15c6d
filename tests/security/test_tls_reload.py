"""Issue 25, finding 12: a SIGHUP reload kept trusting a CA removed from the truststore (the reload
loaded the files into the listener's existing SSL context, and OpenSSL only ever adds CAs to one).
A reload now builds a new context from the files: a client certificate from the removed CA is
refused from the next handshake on, while a connection made before keeps its session."""
from __future__ import annotations

import signal
import ssl
import struct

import pytest
from raw_requests import wait_for_log

from oncelog.protocol.api import ApiKey
from oncelog.testing.raw_client import RawConnection
from oncelog.testing.secure import SecureBroker
from oncelog.testing.tls import make_ca, make_client

pytestmark = pytest.mark.processes


class TlsClient(RawConnection):
    """A mutual-TLS connection to the broker's SSL listener that sends ApiVersions v0."""

    def __init__(self, broker: SecureBroker, cert, key) -> None:
        ctx = ssl.create_default_context(cafile=str(broker.pki.ca))
        ctx.load_cert_chain(str(cert), str(key))
        super().__init__(f"127.0.0.1:{broker.port('SSL')}", ctx)

    def answers(self) -> bool:
        """True if ApiVersions is answered; False if the broker refused or closed the connection
        (with TLS 1.3 a refused client certificate shows at the first read)."""
        try:
            correlation = self.send(ApiKey.API_VERSIONS, 0, b"")
            return struct.unpack(">i", self.recv_frame()[:4])[0] == correlation
        except (ssl.SSLError, ConnectionError, TimeoutError):
            return False


def connects(broker: SecureBroker, cert, key) -> bool:
    try:
        c = TlsClient(broker, cert, key)
    except (ssl.SSLError, ConnectionError):
        return False
    try:
        return c.answers()
    finally:
        c.close()


def test_a_ca_removed_from_the_truststore_is_not_trusted_after_sighup(tmp_path):
    trust = tmp_path / "truststore.pem"
    b = SecureBroker(tmp_path, {"listener.name.ssl.ssl.truststore.location": str(trust)})
    partner_ca = make_ca(b.pki.directory, "partner-ca")
    partner = make_client(b.pki, "partner", ca="partner-ca")
    trust.write_text(b.pki.ca.read_text() + partner_ca.read_text())
    b.start()
    try:
        assert connects(b, *partner) and connects(b, b.client_cert, b.client_key)
        before = TlsClient(b, *partner)            # made while the partner CA was trusted
        assert before.answers()

        trust.write_text(b.pki.ca.read_text())      # the partner CA is withdrawn
        b.process.proc.send_signal(signal.SIGHUP)
        wait_for_log(b.log_file, r"listener SSL: TLS key material reloaded")
        assert not connects(b, *partner)
        wait_for_log(b.log_file, r"TLS handshake failed from 127\.0\.0\.1:\d+ on SSL: .*(CERTIFICATE|certificate)")
        assert connects(b, b.client_cert, b.client_key)   # the CA that stayed still works
        assert before.answers()                           # and so does the connection made before
        before.close()
    finally:
        b.stop()
