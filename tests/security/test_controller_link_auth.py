"""Issue 36, finding 4: a local user captured the cluster credential. With the controller down,
`nobody` bound its port and the next broker login handed over the PLAIN password of
`cluster.credential`, the broker principal and the key to every SCRAM verifier. The controller
link now logs in with SCRAM-SHA-512: the server proves it holds the credential's verifier before
the broker sends anything else, and the client's proof is good for that exchange only. Kafka
offers SCRAM (or TLS with the server verified) on the controller listener for the same reason.

An impostor on a real socket, answering as a controller would, with the broker's own client."""
from __future__ import annotations

import asyncio
import base64
import secrets
import struct

import pytest

from oncelog.broker.cluster.controller_client import ControllerUnavailable, controller_client
from oncelog.broker.config import BrokerConfig
from oncelog.controller.service import CONTROLLER_MECHANISMS, Controller, ControllerConfig
from oncelog.core.security.plain import client_token
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.headers import read_request_header, response_header
from oncelog.testing.raw_client import AsyncRawConnection

USER, PASSWORD = "oncelog-broker", "the-cluster-secret-" + secrets.token_hex(8)
OPEN = {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}


class Impostor:
    """Whatever the client asks: yes. Every mechanism is accepted, PLAIN logins succeed, SCRAM gets
    a server-first of the impostor's making and a server signature it cannot compute."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bytes]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                frame = await reader.readexactly(struct.unpack(">i", await reader.readexactly(4))[0])
                h = read_request_header(frame)
                body = bytes(frame[h.body_offset:])
                self.seen.append((h.api_key, body))
                rb = entities.ResponseBuilder(h.api_key, h.api_version)
                if h.api_key == ApiKey.SASL_HANDSHAKE:
                    answer = rb.encode(error_code=0, mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))
                elif h.api_key == ApiKey.SASL_AUTHENTICATE:
                    token = bytes(entities.decode_request(h.api_key, h.api_version, body).auth_bytes)
                    if token.startswith(b"n,,"):        # SCRAM client-first: r=<client nonce>
                        nonce = token.decode().split("r=", 1)[1]
                        reply = f"r={nonce}imp,s={base64.b64encode(b'salt' * 8).decode()},i=4096".encode()
                    elif token.startswith(b"c="):       # client-final: a signature of the impostor's making
                        reply = b"v=" + base64.b64encode(secrets.token_bytes(64))
                    else:                               # PLAIN: welcome
                        reply = b""
                    answer = rb.encode(error_code=0, error_message=None, auth_bytes=reply, session_lifetime=0)
                else:
                    return                              # a request it could now answer as it likes
                header = response_header(h.api_key, h.api_version, h.correlation_id)
                writer.write(struct.pack(">i", len(header) + len(answer)) + header + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_the_controller_link_gives_an_impostor_on_the_port_no_reusable_secret(tmp_path):
    impostor = Impostor()
    server = await asyncio.start_server(impostor.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = controller_client(BrokerConfig({
        "log.dirs": str(tmp_path / "data"), "node.id": "1", "process.roles": "broker",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{port}",
        "controller.sasl.plain.username": USER, "controller.sasl.plain.password": PASSWORD}))
    try:
        with pytest.raises((KafkaProtocolError, ControllerUnavailable)):
            await client.request(ApiKey.ALLOCATE_PRODUCER_IDS, 0, broker_id=1, broker_epoch=0)
    finally:
        client.close()
        server.close()
        await server.wait_closed()
    assert impostor.seen, "the client never reached the impostor"
    assert not [k for k, _ in impostor.seen if k not in OPEN], "a request went to an unauthenticated server"
    assert all(PASSWORD.encode() not in body for _, body in impostor.seen), "the password went out"
    assert all(client_token(USER, PASSWORD) not in body for _, body in impostor.seen)


async def test_the_controller_serves_scram_logins_and_answers_failures_after_the_delay(tmp_path):
    """The real controller's side: SCRAM-SHA-256 and -512 logins of its users, PLAIN still for
    other tools, and (KIP-306) a failed login's answer itself waits the delay."""
    from oncelog.controller.connection_limits import ConnectionLimits
    controller = Controller(ControllerConfig(str(tmp_path / "meta"), users={USER: PASSWORD},
                                             cluster_principals={USER},
                                             limits=ConnectionLimits(failed_authentication_delay_ms=400)))
    await controller.start()
    host, port = controller.address
    try:
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            config = BrokerConfig({"log.dirs": str(tmp_path / "data"), "node.id": "1",
                                   "controller.quorum.bootstrap.servers": f"{host}:{port}",
                                   "controller.sasl.plain.username": USER,
                                   "controller.sasl.plain.password": PASSWORD})
            client = controller_client(config)
            client.mechanism = mechanism
            r = await client.request(ApiKey.ALLOCATE_PRODUCER_IDS, 0, broker_id=1, broker_epoch=-1)
            assert int(r.error_code) != 31, f"{mechanism} login did not make the cluster principal"
            client.close()
        c = await AsyncRawConnection.open(host, port)
        hs = await c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="GSSAPI")
        assert int(hs.error_code) == 33 and tuple(hs.mechanisms) == CONTROLLER_MECHANISMS
        await c.close()
        c = await AsyncRawConnection.open(host, port)
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await c.plain_login(USER, "wrong") == 58
        assert loop.time() - start >= 0.4, "a failed login was answered before the delay"
        await c.close()
    finally:
        await controller.stop()
