"""Issue 25, finding 7 and the SCRAM note: oncelog's client accepted an iteration count of 1 from a
server, so a rogue server recovered the password offline in 0.26 s from the proof the client sent;
and the broker's SCRAM mock for a user that does not exist showed a 16-byte salt and 4096
iterations where real users showed 64 bytes and 8192, which told an attacker who exists.

Kafka's client (ScramSaslClient) refuses fewer than 4096 iterations before it sends a proof, and
checks the server's signature; oncelog's does both. The broker's mock now has the salt length and
iteration count of the stored credentials.

Written as the attack: a rogue server on a socket, and raw SCRAM first messages to a broker."""
from __future__ import annotations

import asyncio
import base64
import re
import secrets

import pytest
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from oncelog.client.aio.connection import AuthenticationError, Connection
from oncelog.client.security import ClientSecurity
from oncelog.core.security.scram import ScramClient
from oncelog.core.security.scram import ScramMechanism as Mechanism
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.headers import read_request_header, response_header
from oncelog.protocol.primitives import I32
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

# ------------------------------------------------------------------ a rogue server


class RogueScramServer:
    """Answers ApiVersions and SaslHandshake like a broker, then the SCRAM exchange its own way:
    `iterations` in its server-first message, `signature` (or the right one) in its server-final."""

    def __init__(self, iterations: int, signature: bytes | None = None) -> None:
        self.iterations = iterations
        self.signature = signature
        self.tokens: list[bytes] = []       # what the client sent in its SaslAuthenticate requests
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                frame = memoryview(await reader.readexactly(I32.unpack(await reader.readexactly(4))[0]))
                h = read_request_header(frame)
                rb = entities.ResponseBuilder(h.api_key, h.api_version)
                if h.api_key == ApiKey.API_VERSIONS:
                    keys = tuple(rb("ApiVersion", api_key=k, min_version=0, max_version=v)
                                 for k, v in ((ApiKey.API_VERSIONS, 3), (ApiKey.SASL_HANDSHAKE, 1),
                                              (ApiKey.SASL_AUTHENTICATE, 2)))
                    body = rb.encode(error_code=0, api_keys=keys, throttle_time=0, supported_features=(),
                                     finalized_features_epoch=-1, finalized_features=(), zk_migration_ready=False)
                elif h.api_key == ApiKey.SASL_HANDSHAKE:
                    body = rb.encode(error_code=0, mechanisms=("SCRAM-SHA-256",))
                else:
                    token = bytes(entities.decode_request(h.api_key, h.api_version, frame[h.body_offset:]).auth_bytes)
                    self.tokens.append(token)
                    body = rb.encode(error_code=0, error_message=None, auth_bytes=self._answer(token),
                                     session_lifetime=0)
                header = response_header(h.api_key, h.api_version, h.correlation_id)
                writer.write(I32.pack(len(header) + len(body)) + header + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, token: bytes) -> bytes:
        if len(self.tokens) == 1:           # client-first: n,,n=user,r=nonce
            self._first_bare = token.decode()[3:]
            nonce = self._first_bare.split("r=", 1)[1] + secrets.token_hex(12)
            salt = base64.b64encode(secrets.token_bytes(16)).decode()
            self._server_first = f"r={nonce},s={salt},i={self.iterations}"
            return self._server_first.encode()
        signature = self.signature or b"\0" * 32
        return b"v=" + base64.b64encode(signature)


async def _login(port: int) -> None:
    security = ClientSecurity("SASL_PLAINTEXT", "SCRAM-SHA-256", "alice", "alice-secret")
    conn = Connection("127.0.0.1", port, "scram-test", security=security)
    try:
        await conn.connect(10)
    finally:
        conn.close()


@pytest.mark.parametrize("iterations", [1, 4095])
async def test_client_refuses_fewer_than_4096_iterations_before_it_sends_a_proof(iterations):
    rogue = RogueScramServer(iterations)
    port = await rogue.start()
    try:
        with pytest.raises(AuthenticationError, match=f"Requested iterations {iterations} is less than the "
                                                      "minimum 4096"):
            await _login(port)
    finally:
        await rogue.stop()
    assert len(rogue.tokens) == 1, "the client sent its proof to a server asking for too few iterations"


async def test_client_refuses_a_server_final_with_the_wrong_signature():
    rogue = RogueScramServer(4096, signature=secrets.token_bytes(32))
    port = await rogue.start()
    try:
        with pytest.raises(AuthenticationError, match="Invalid server signature"):
            await _login(port)
    finally:
        await rogue.stop()
    assert len(rogue.tokens) == 2


# ------------------------------------------------------------------ the broker's mock

_SERVER_FIRST = re.compile(r"r=[^,]+,s=([^,]*),i=(\d+)")


def _shown(address: str, mechanism: Mechanism, user: str) -> tuple[bytes, int]:
    """(salt, iterations) the broker's server-first message shows for `user`."""
    with RawConnection(address) as c:
        assert int(c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism=mechanism.mechanism_name).error_code) == 0
        first = ScramClient(mechanism, user, "any", secrets.token_bytes).first_message()
        answer = c.call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=first)
        assert int(answer.error_code) == 0
        m = _SERVER_FIRST.fullmatch(bytes(answer.auth_bytes).decode())
        assert m is not None
        return base64.b64decode(m.group(1)), int(m.group(2))


@pytest.mark.processes
def test_scram_mock_shows_an_unknown_user_what_real_users_show(tmp_path):
    """SCRAM-SHA-256 users come from `--add-scram` (its defaults), SCRAM-SHA-512 users from
    confluent-kafka's AdminClient with 8192 iterations (librdkafka's salt): each mechanism's unknown
    users look like its real ones, always the same for one name, different between names."""
    with BrokerProcess(tmp_path / "data", {
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "oncelog.add.scram": "SCRAM-SHA-256=[name=admin,password=admin-secret]"}) as b:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{b.listener_ports['PLAINTEXT']}"})
        for f in admin.alter_user_scram_credentials([
                UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                             f"{user}-secret".encode()) for user in ("alice", "bob")]).values():
            f.result(30)
        sasl = f"127.0.0.1:{b.listener_ports['SASL_PLAINTEXT']}"
        for mechanism, known in ((Mechanism.SCRAM_SHA_256, "admin"), (Mechanism.SCRAM_SHA_512, "alice")):
            salt, iterations = _shown(sasl, mechanism, known)
            unknown = [_shown(sasl, mechanism, f"nobody-{i}") for i in range(5)]
            assert {(len(s), i) for s, i in unknown} == {(len(salt), iterations)}, mechanism
            assert len({s for s, _ in unknown}) == 5                         # a salt per name
            assert _shown(sasl, mechanism, "nobody-0") == unknown[0]         # the same at every try
        assert _shown(sasl, Mechanism.SCRAM_SHA_512, "alice")[1] == 8192
