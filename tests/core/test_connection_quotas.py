"""Kafka's ConnectionQuotas, pure (ConnectionQuotasTest's rules): per-listener and broker-wide
`max.connections` with the protected inter-broker listener, the creation rates' waits, the `ip`
entities' `connection_creation_rate`, `max.connections.per.ip` with its overrides."""
import pytest

from oncelog.core.security.connection_quotas import UNLIMITED, ConnectionQuotas, canonical_ip


def quotas(**kw) -> ConnectionQuotas:
    q = ConnectionQuotas(**kw)
    for name in ("CLIENT", "INTERNAL"):
        q.set_listener(name)
    return q


def connect(q: ConnectionQuotas, listener: str, ip: str, now_ms: int = 0):
    wait = q.record_connection(listener, now_ms)
    assert wait == 0 and q.slot_available(listener)
    return q.admit(listener, ip, now_ms)


def test_a_listener_at_its_max_connections_has_no_slot_until_one_is_released():
    q = quotas()
    q.set_listener("CLIENT", max_connections=2)
    assert connect(q, "CLIENT", "10.0.0.1") is None and connect(q, "CLIENT", "10.0.0.2") is None
    assert not q.slot_available("CLIENT") and q.slot_available("INTERNAL")
    q.release("CLIENT", "10.0.0.1")
    assert q.slot_available("CLIENT") and q.count("CLIENT") == 1 and q.count() == 1


def test_broker_max_connections_spares_the_protected_listener_which_may_exceed_it():
    q = quotas(max_connections=2, protected_listener="INTERNAL")
    connect(q, "CLIENT", "10.0.0.1")
    connect(q, "CLIENT", "10.0.0.2")
    assert not q.slot_available("CLIENT")
    assert q.slot_available("INTERNAL") and q.is_protected("INTERNAL")
    assert connect(q, "INTERNAL", "10.0.0.3") is None
    assert q.excess()                       # a CLIENT connection must make room
    q.release("CLIENT", "10.0.0.1")
    assert not q.excess()


def test_the_inter_broker_listener_is_protected_only_beside_another_listener():
    q = ConnectionQuotas(max_connections=1, protected_listener="INTERNAL")
    q.set_listener("INTERNAL")
    connect(q, "INTERNAL", "10.0.0.1")
    assert not q.is_protected("INTERNAL") and not q.slot_available("INTERNAL")


def test_broker_and_listener_creation_rates_make_the_acceptor_wait_at_most_a_window():
    q = quotas(max_creation_rate=5)
    waits = [q.record_connection("CLIENT", 0) for _ in range(60)]
    assert waits[:50] == [0] * 50               # 5/s over the rate's 10-second minimum window
    assert 0 < waits[50] <= 1000 and max(waits) == 1000
    q = quotas()
    q.set_listener("CLIENT", max_creation_rate=2)
    assert [q.record_connection("CLIENT", 0) for _ in range(21)][-1] == 500  # (21/10 - 2) / 2 * 10 s
    assert q.record_connection("INTERNAL", 0) == 0                           # a listener's own rate


def test_an_address_over_its_connection_creation_rate_is_refused_with_a_delay_and_not_counted():
    q = quotas()
    q.set_ip_rates({"10.0.0.1": 2})
    assert all(q.admit("CLIENT", "10.0.0.1", 0) is None for _ in range(20))
    refusal = q.admit("CLIENT", "10.0.0.1", 0)
    assert refusal is not None and refusal.delay_ms == 500 and "connection_creation_rate" in refusal.reason
    assert q.count(ip="10.0.0.1") == 20 and q.count() == 20
    assert q.admit("CLIENT", "10.0.0.2", 0) is None        # other addresses have no quota
    assert q.admit("CLIENT", "10.0.0.1", 1000) is not None
    # refused connections were taken back from the rate: 21 over 10.5 s is 2/s again
    assert q.admit("CLIENT", "10.0.0.1", 10500) is None


def test_the_default_ip_entity_applies_to_addresses_without_their_own():
    q = quotas()
    q.set_ip_rates({None: 1, "10.0.0.9": UNLIMITED - 1})
    assert all(q.admit("CLIENT", "10.0.0.1", 0) is None for _ in range(10))
    assert q.admit("CLIENT", "10.0.0.1", 0) is not None
    assert all(q.admit("CLIENT", "10.0.0.9", 0) is None for _ in range(50))


def test_max_connections_per_ip_and_its_overrides_close_at_once():
    q = quotas(max_per_ip=2, per_ip_overrides={"10.0.0.9": 0, "0:0:0:0:0:0:0:1": 1})
    assert connect(q, "CLIENT", "10.0.0.1") is None and connect(q, "CLIENT", "10.0.0.1") is None
    refusal = connect(q, "CLIENT", "10.0.0.1")
    assert refusal is not None and refusal.reason == "Too many connections from 10.0.0.1 (maximum = 2)"
    assert refusal.delay_ms == 0
    assert connect(q, "CLIENT", "10.0.0.9") is not None
    assert connect(q, "CLIENT", "::1") is None and connect(q, "CLIENT", "::1") is not None


@pytest.mark.parametrize(("given", "canonical"), [
    ("::1", "::1"), ("0:0:0:0:0:0:0:1", "::1"), ("[::1]", "::1"), ("::ffff:127.0.0.1", "127.0.0.1"),
    ("127.0.0.1", "127.0.0.1"), ("host.example", "host.example")])
def test_addresses_compare_as_addresses(given, canonical):
    assert canonical_ip(given) == canonical


def test_idle_address_sensors_are_forgotten_after_an_hour():
    q = quotas()
    q.set_ip_rates({None: 100})
    q.admit("CLIENT", "10.0.0.1", 0)
    assert q.expire(3_599_999) == 0 and q.expire(3_600_000) == 1
