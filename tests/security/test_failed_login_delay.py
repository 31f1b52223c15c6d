"""Issue 36 (from the earlier probes): a failed login was answered at once, only the close waited:
10 wrong PLAIN passwords answered in under 50 ms on the broker's SASL listeners. Kafka (KIP-306)
sends the failure answer itself after `connection.failed.authentication.delay.ms`, then closes;
other connections are served meanwhile. (The controller's side: test_controller_link_auth.py and
test_limits_pre_auth.py.) In-process broker over real sockets, raw SASL requests."""
from __future__ import annotations

import asyncio

from oncelog.broker.config import BrokerConfig
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import AsyncRawConnection
from oncelog.testing.secure import jaas

DELAY_MS = 600


async def test_a_failed_login_is_answered_after_the_delay_and_others_are_served_meanwhile(tmp_path):
    broker = InProcessBroker(BrokerConfig({
        "log.dirs": str(tmp_path / "data"), "node.id": "1", "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN", "connection.failed.authentication.delay.ms": str(DELAY_MS),
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas({"alice": "alice-pw"})}))
    host, port = (await broker.start())[:2]
    loop = asyncio.get_running_loop()
    try:
        guesser = await AsyncRawConnection.open(host, port)
        started = loop.time()
        guess = asyncio.ensure_future(guesser.plain_login("alice", "wrong"))
        await asyncio.sleep(0)
        # another client logs in and is answered while the guesser waits
        other = await AsyncRawConnection.open(host, port)
        assert await other.plain_login("alice", "alice-pw") == E.NONE
        served = loop.time() - started
        assert int((await other.call(ApiKey.API_VERSIONS, 3, client_software_name="t",
                                     client_software_version="1")).error_code) == E.NONE
        assert await guess == E.SASL_AUTHENTICATION_FAILED
        answered = loop.time() - started
        assert answered >= DELAY_MS / 1000, f"the failure was answered after {answered * 1000:.0f} ms"
        assert served < answered, "the other client waited for the guesser"
        # then closed
        try:
            await asyncio.wait_for(guesser.reader.read(1), 5)
        except ConnectionError:
            pass
        assert guesser.reader.at_eof()
        # an unsupported mechanism: the same delay before its answer
        c = await AsyncRawConnection.open(host, port)
        started = loop.time()
        hs = await c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="GSSAPI")
        assert int(hs.error_code) == E.UNSUPPORTED_SASL_MECHANISM and loop.time() - started >= DELAY_MS / 1000
        for conn in (guesser, other, c):
            await conn.close()
    finally:
        await broker.stop()
