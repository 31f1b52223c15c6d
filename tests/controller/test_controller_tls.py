"""The controller link secured as a listener: the controller speaks TLS, a broker that trusts its
CA registers and serves; one that does not cannot reach it. PLAIN on the link compares in
constant time (core.security.plain), a wrong password is refused."""
from __future__ import annotations

import asyncio

import pytest

from oncelog.broker.cluster.controller_client import ControllerUnavailable, controller_client
from oncelog.broker.config import BrokerConfig
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.testing.embedded import BrokerProcess, ControllerProcess, broker_overrides
from oncelog.testing.tls import make_pki

pytestmark = pytest.mark.processes


def test_broker_reaches_a_tls_controller_only_when_it_trusts_it(tmp_path):
    pki = make_pki(tmp_path / "pki")
    ctl = ControllerProcess(tmp_path / "metadata")
    ctl.ssl_keystore = str(pki.broker_pem())
    ctl.start()
    try:
        secure = {**broker_overrides(ctl, 1), "controller.listener.names": "CONTROLLER",
                  "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_SSL",
                  "listener.name.controller.ssl.truststore.location": str(pki.ca)}
        b = BrokerProcess(tmp_path / "data", secure).start()
        try:
            from confluent_kafka import Producer
            p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
            p.produce("t", b"v")
            assert p.flush(30) == 0   # an idempotent producer: its id came over the TLS link
        finally:
            b.stop()
        # trusting only the system's CAs: the handshake fails, the controller is unreachable
        untrusting = BrokerConfig({**broker_overrides(ctl, 2), "controller.listener.names": "CONTROLLER",
                                   "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL"})
        with pytest.raises(ControllerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(_ask(controller_client(untrusting)))
        # trusted, but a wrong PLAIN password
        wrong = BrokerConfig({**secure, "controller.sasl.plain.password": "not-it"})
        with pytest.raises(KafkaProtocolError) as e:
            asyncio.run(_ask(controller_client(wrong)))
        assert e.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "SASL/PLAIN authentication failed for 'broker': wrong password" in ctl.log_tail(20000)
    finally:
        ctl.stop()


async def _ask(client):
    try:
        return await client.request(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    finally:
        client.close()
