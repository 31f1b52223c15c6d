"""Issue 25, finding 10: limits were accepted and not enforced. With
`listener.name.<l>.max.connections=5`, 8 of 8 connections were served; with an `ip` quota of
`connection_creation_rate=2`, 30 of 30 connections opened in 0.1 s were served.

Kafka (KIP-402, KIP-612; ConnectionQuotas): at a listener's `max.connections` the acceptor stops
accepting until a connection of that listener closes (new ones wait in the backlog; other
listeners go on); an address over its `connection_creation_rate` has its new connections accepted,
never served, and closed after the throttle time. Its rate is measured over at least 10 windows of
a second, so with a rate of 2 a burst of 20 connections fits and the rest are refused.

Written as the attack: raw sockets opened as fast as the test can."""
from __future__ import annotations

import re

import pytest

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes


def _answered(c: RawConnection, timeout_s: float) -> bool:
    """Whether the ApiVersions sent on `c` is answered within `timeout_s` (False if closed)."""
    c.sock.settimeout(timeout_s)
    try:
        c.recv_frame()
        return True
    except (TimeoutError, ConnectionError):
        return False
    finally:
        c.sock.settimeout(c.timeout_s)


def _asking(address: str) -> RawConnection:
    c = RawConnection(address)
    c.send(ApiKey.API_VERSIONS, 0, b"")
    return c


def test_a_listener_holds_at_most_its_max_connections_and_takes_the_next_when_one_closes(tmp_path):
    with BrokerProcess(tmp_path / "data", {
            "listeners": "PLAINTEXT://127.0.0.1:0,LIMITED://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,LIMITED:PLAINTEXT",
            "listener.name.limited.max.connections": "5"}) as b:
        limited = f"127.0.0.1:{b.listener_ports['LIMITED']}"
        conns = [_asking(limited) for _ in range(8)]
        try:
            assert all(_answered(c, 10) for c in conns[:5])
            assert not any(_answered(c, 1) for c in conns[5:]), "more than 5 connections were served"
            # another listener is not held up by this one's limit
            with RawConnection(f"127.0.0.1:{b.listener_ports['PLAINTEXT']}") as other:
                assert other.api_versions() == 0
            conns[0].close()
            conns[1].close()
            assert _answered(conns[5], 10) and _answered(conns[6], 10)   # they waited, then were served
            assert not _answered(conns[7], 1)
            # a dynamic change of the limit (IncrementalAlterConfigs on this broker) lets the next one in
            q = entities.RequestBuilder(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1)
            config = q("AlterableConfig", name="listener.name.limited.max.connections", config_operation=0, value="6")
            with RawConnection(b.bootstrap) as admin:
                answer = admin.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=(
                    q("AlterConfigsResource", resource_type=4, resource_name="1", configs=(config,)),))
            assert int(answer.responses[0].error_code) == 0, answer
            assert _answered(conns[7], 10)
        finally:
            for c in conns:
                c.close()


def _set_ip_quota(address: str, ip: str | None, rate: float) -> None:
    q = entities.RequestBuilder(ApiKey.ALTER_CLIENT_QUOTAS, 1)
    entry = q("EntryData", entity=(q("EntityData", entity_type="ip", entity_name=ip),),
              ops=(q("OpData", key="connection_creation_rate", value=rate, remove=False),))
    with RawConnection(address) as admin:
        answer = admin.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, entries=(entry,), validate_only=False)
    assert [int(e.error_code) for e in answer.entries] == [0], answer


@pytest.mark.parametrize("entity", ["127.0.0.1", None], ids=["address", "default"])
def test_an_address_over_its_connection_creation_rate_is_not_served(tmp_path, entity):
    with BrokerProcess(tmp_path / "data") as b:
        _set_ip_quota(b.bootstrap, entity, 2)
        conns = [_asking(b.bootstrap) for _ in range(30)]
        try:
            served = [_answered(c, 10) for c in conns]
        finally:
            for c in conns:
                c.close()
        # 20 fit in the rate's 10-second minimum window; the others were closed unanswered
        assert served[0] and sum(served) <= 20, f"{sum(served)} of 30 connections served"
        assert re.search(r"connection creation rate of 127\.0\.0\.1 over its quota of 2/s",
                         b.log_file.read_text())
