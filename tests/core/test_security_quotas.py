"""Client quotas: Kafka's rate and throttle arithmetic (ClientQuotaManagerTest's numbers), the
entity precedence and which clients share a quota, the settings store behind
AlterClientQuotas/DescribeClientQuotas, and the per-address overrides' syntax."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tiers import examples

from oncelog.core.security.quotas import (
    CONSUMER_BYTE_RATE,
    DEFAULT,
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuotaManager,
    ClientQuotaStore,
    FilterComponent,
    QuotaAlteration,
    QuotaEntity,
    QuotaOp,
    Rate,
    parse_per_ip_overrides,
    request_percentage,
    throttle_time_ms,
)
from oncelog.protocol.errors import ErrorCode

T0 = 1_700_000_000_000
SAMPLES = 11


def manager(overrides, **kw):
    return ClientQuotaManager(overrides, **kw)


def test_quota_violation_throttle_time():
    # ClientQuotaManagerTest.testQuotaViolation: default client-id quota of 500 B/s
    m = manager({QuotaEntity(None, DEFAULT): 500.0})
    now = T0
    for _ in range(10):
        assert m.record("ANONYMOUS", "unknown", 400, now) == 0
        now += 1000
    # 400*10 + 2000 + 300 = 6300 over 10.5 s = 600 B/s; (600 - 500) / 500 * 10.5 s = 2100 ms
    now += 500
    assert m.record("ANONYMOUS", "unknown", 2300, now) == 2100
    now += 2100
    for _ in range(10):
        m.record("ANONYMOUS", "unknown", 400, now)
        now += 1000
    assert m.record("ANONYMOUS", "unknown", 0, now) == 0


def check(m, user, client, bound, value, expect_throttle, now=T0):
    assert m.quota(user, client) == bound
    expected_max = math.inf if bound is None else bound * (SAMPLES - 1) * 1.0
    assert m.max_value_in_window(user, client) == expected_max
    throttle = m.record(user, client, value * SAMPLES, now)
    assert (throttle > 0) is expect_throttle, (user, client, bound, value, throttle)


def test_quota_config_precedence():
    # ClientQuotaManagerTest.testQuotaConfigPrecedence, step by step; the clock never moves, so a
    # recorded value v*11 reads as a rate of 1.1*v
    q = {}
    m = manager(q)
    q[QuotaEntity(DEFAULT)] = 1000
    q[QuotaEntity(None, DEFAULT)] = 2000
    q[QuotaEntity(DEFAULT, DEFAULT)] = 3000
    q[QuotaEntity("userA")] = 4000
    q[QuotaEntity("userA", "client1")] = 5000
    q[QuotaEntity("userB")] = 6000
    q[QuotaEntity("userB", "client1")] = 7000
    q[QuotaEntity("userB", DEFAULT)] = 8000
    q[QuotaEntity("userC")] = 10000
    q[QuotaEntity(None, "client1")] = 9000

    check(m, "userA", "client1", 5000, 4500, False)   # <user, client> over <user>
    check(m, "userA", "client2", 4000, 4500, True)    # <user> over <client> and defaults
    check(m, "userA", "client3", 4000, 0, True)       # <user> is shared by the user's clients
    check(m, "userA", "client1", 5000, 0, False)      # <user, client> is that client's alone

    check(m, "userB", "client1", 7000, 8000, True)
    check(m, "userB", "client2", 8000, 7000, False)   # default client-id of a user: per client
    check(m, "userB", "client3", 8000, 7000, False)

    check(m, "userD", "client1", 3000, 3500, True)    # default <user, client>
    check(m, "userD", "client2", 3000, 2500, False)
    check(m, "userE", "client1", 3000, 2500, False)

    del q[QuotaEntity(DEFAULT, DEFAULT)]               # back to the <user> default
    check(m, "userD", "client1", 1000, 0, False)      # another sensor: the count restarts
    check(m, "userE", "client4", 1000, 1500, True)
    check(m, "userF", "client4", 1000, 800, False)    # default <user> shared by the user's clients
    check(m, "userF", "client5", 1000, 800, True)

    del q[QuotaEntity(DEFAULT)]                        # back to the <client-id> default
    check(m, "userF", "client4", 2000, 0, False)      # default <client-id>: shared by all its users
    check(m, "userF", "client5", 2000, 0, False)
    check(m, "userF", "client5", 2000, 2500, True)
    check(m, "userG", "client5", 2000, 0, True)

    q[QuotaEntity("userA")] = 8000
    q[QuotaEntity("userA", "client1")] = 10000
    check(m, "userA", "client2", 8000, 0, False)
    check(m, "userA", "client2", 8000, 4500, True)    # the sum of the new and the earlier values
    check(m, "userA", "client1", 10000, 0, False)
    check(m, "userA", "client1", 10000, 6000, True)
    del q[QuotaEntity("userA", "client1")]
    check(m, "userA", "client6", 8000, 0, True)       # the shared user quota
    q[QuotaEntity("userA", "client6")] = 11000
    check(m, "userA", "client6", 11000, 8500, False)
    q[QuotaEntity("userA", DEFAULT)] = 12000
    del q[QuotaEntity("userA", "client6")]
    check(m, "userA", "client6", 12000, 4000, True)


def test_set_and_remove_default_user_quota():
    q = {}
    m = manager(q)
    check(m, "userA", "client1", None, 1000, False)
    q[QuotaEntity(DEFAULT)] = 10
    check(m, "userA", "client1", 10, 1000, True)
    del q[QuotaEntity(DEFAULT)]
    check(m, "userA", "client1", None, 1000, False)


def test_max_value_in_window_with_other_window_count():
    # testGetMaxValueInQuotaWindowWithNonDefaultQuotaWindow: 4 samples = 3 full windows
    m = ClientQuotaManager({QuotaEntity(DEFAULT): 10}, samples=4)
    assert m.max_value_in_window("userA", "client1") == 30
    assert ClientQuotaManager({}).max_value_in_window("userA", "client1") == math.inf


def test_request_quota_throttle_is_capped_at_one_window():
    m = ClientQuotaManager({QuotaEntity(None, DEFAULT): 10.0}, max_throttle_ms=1000)
    assert m.record("u", "c", 10_000, T0) == 1000
    assert request_percentage(500_000_000) == 50.0


def test_unrecord_takes_a_throttled_fetch_back():
    m = manager({QuotaEntity("u"): 100})
    assert m.record("u", "c", 2000, T0) > 0
    m.unrecord("u", "c", 2000, T0)
    assert m.record("u", "c", 0, T0) == 0


def test_idle_sensors_expire_after_an_hour():
    m = manager({QuotaEntity(DEFAULT): 100})
    m.record("a", "c", 1, T0)
    m.record("b", "c", 1, T0 + 1800_000)
    assert m.expire(T0 + 3600_000) == 1 and m.expire(T0 + 5400_000) == 1


def test_rate_window_rules():
    r = Rate(samples=11, window_ms=1000)
    r.record(1100, T0)
    assert r.window_size_ms(T0) == 10_000            # never less than n-1 full windows
    assert r.measure(T0) == 110.0
    r2 = Rate(samples=2, window_ms=1000)
    r2.record(100, T0)
    r2.record(100, T0 + 1000)
    r2.record(100, T0 + 2000)
    # the first sample has expired (samples * window since its last value): 200 over one window
    assert r2.measure(T0 + 2000) == 200.0 and r2.window_size_ms(T0 + 2000) == 1000
    assert r2.measure(T0 + 4001) == 0                 # everything older than samples*window expired


def _complete_sample(rate, now):
    """SampledStatTest.completeSample: a value at the start and at the end of a window."""
    rate.record(1, now)
    rate.record(1, now + 999)
    return now + 1000


def test_sample_is_purged_if_it_does_not_overlap_the_window():
    r = Rate(samples=2, window_ms=1000)
    now = _complete_sample(r, T0) + 2500
    assert r.total(now) == 0


def test_sample_is_kept_if_it_overlaps_the_window():
    r = Rate(samples=2, window_ms=1000)
    now = _complete_sample(r, T0) + 1500
    assert r.total(now) == 2


def test_sample_is_kept_if_it_overlaps_and_is_the_extra_one():
    r = Rate(samples=2, window_ms=1000)
    now = _complete_sample(r, T0) + 100
    now = _complete_sample(r, now) + 100
    r.record(1, now)
    assert r.total(now) == 5         # three samples: Kafka keeps samples + 1


PRECEDENCE = [("u", "c"), ("u", DEFAULT), ("u", None), (DEFAULT, "c"), (DEFAULT, DEFAULT), (DEFAULT, None),
              (None, "c"), (None, DEFAULT)]


@pytest.mark.parametrize("i, j", [(i, j) for i in range(8) for j in range(i + 1, 8)])
def test_precedence_of_every_pair(i, j):
    """ClientQuotaManager's order: u+c, u+<default c>, u, <default u>+c, <default u>+<default c>,
    <default u>, c, <default c>; the earlier of any two configured entities applies."""
    q = {QuotaEntity(*PRECEDENCE[i]): 100.0 + i, QuotaEntity(*PRECEDENCE[j]): 100.0 + j}
    assert manager(q).quota("u", "c") == 100.0 + i


def test_throttle_formula_rounds_like_java():
    assert throttle_time_ms(600, 500, 10_500) == 2100
    assert throttle_time_ms(501, 500, 1000) == 2
    assert throttle_time_ms(500.25, 500, 1000) == 1   # 0.5 rounds up


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 50_000)), min_size=1, max_size=60),
       st.integers(100, 100_000))
def test_after_the_throttle_the_rate_is_back_at_the_quota(steps, quota):
    """The throttle time is exactly what brings the measured rate back to the quota if nothing
    else is recorded (within a millisecond of rounding), as QuotaUtils documents."""
    m = manager({QuotaEntity("u"): float(quota)})
    now = T0
    for gap, value in steps:
        now += gap
        throttle = m.record("u", "c", value, now)
        rate = m._sensors[("u", "")].rate
        if throttle:
            size = rate.window_size_ms(now)
            total = rate.measure(now) * size / 1000
            assert total / ((size + throttle) / 1000) == pytest.approx(quota, rel=0.01, abs=total / size)


# ------------------------------------------------------------------ the settings (AlterClientQuotas)

def alter(store, entity, *ops):
    records, [(_, code, message)] = store.decide_alter([QuotaAlteration(entity, [QuotaOp(*o) for o in ops])])
    if code == ErrorCode.NONE:
        for r in records:
            store.replay(r)
    return code, message, records


def test_alter_and_describe():
    store = ClientQuotaStore()
    assert alter(store, [("user", "alice")], (PRODUCER_BYTE_RATE, 1024))[0] == ErrorCode.NONE
    assert alter(store, [("user", None), ("client-id", None)], (CONSUMER_BYTE_RATE, 2048),
                 (REQUEST_PERCENTAGE, 50.5))[0] == ErrorCode.NONE
    assert alter(store, [("client-id", "app")], (PRODUCER_BYTE_RATE, 10))[0] == ErrorCode.NONE
    assert store.overrides(PRODUCER_BYTE_RATE) == {QuotaEntity("alice"): 1024, QuotaEntity(None, "app"): 10}
    assert store.quotas(QuotaEntity(DEFAULT, DEFAULT)) == {CONSUMER_BYTE_RATE: 2048, REQUEST_PERCENTAGE: 50.5}

    code, _, found = store.describe([FilterComponent("user", MATCH_EXACT, "alice")], strict=False)
    assert code == ErrorCode.NONE and found == [(QuotaEntity("alice"), {PRODUCER_BYTE_RATE: 1024})]
    assert [e for e, _ in store.describe([FilterComponent("user", MATCH_DEFAULT)], strict=False)[2]] == \
        [QuotaEntity(DEFAULT, DEFAULT)]
    assert store.describe([FilterComponent("user", MATCH_DEFAULT)], strict=True)[2] == []
    assert [e for e, _ in store.describe([FilterComponent("user", MATCH_ANY)], strict=False)[2]] == \
        [QuotaEntity("alice")]
    assert len(store.describe([], strict=False)[2]) == 3 and store.describe([], strict=True)[2] == []

    # unchanged values make no records; removing what is not there neither
    assert alter(store, [("user", "alice")], (PRODUCER_BYTE_RATE, 1024))[2] == []
    assert alter(store, [("user", "alice")], (CONSUMER_BYTE_RATE, 0, True))[2] == []
    assert alter(store, [("user", "alice")], (PRODUCER_BYTE_RATE, 0, True))[0] == ErrorCode.NONE
    assert QuotaEntity("alice") not in store.overrides(PRODUCER_BYTE_RATE)
    assert store.describe([FilterComponent("user", MATCH_EXACT, "alice")], strict=False)[2] == []


def test_a_replayed_change_applies_to_the_next_request():
    store = ClientQuotaStore()
    m = ClientQuotaManager(store.overrides(PRODUCER_BYTE_RATE))
    assert m.record("alice", "c", 10**9, T0) == 0
    alter(store, [("user", "alice")], (PRODUCER_BYTE_RATE, 1000))
    assert m.record("alice", "c", 100_000, T0) > 0


@pytest.mark.parametrize("entity, ops, message", [
    ([], [(PRODUCER_BYTE_RATE, 1)], "Invalid empty client quota entity"),
    ([("user", "a"), ("user", "b")], [(PRODUCER_BYTE_RATE, 1)], "duplicate entity entry user"),
    ([("group", "a")], [(PRODUCER_BYTE_RATE, 1)], "Unhandled client quota entity type: group"),
    ([("user", "")], [(PRODUCER_BYTE_RATE, 1)], "Empty user not supported"),
    ([("ip", "1.2.3.4"), ("user", "a")], [("connection_creation_rate", 1)], "IP entity should not be combined"),
    ([("ip", "not-an-ip")], [("connection_creation_rate", 1)], "not-an-ip is not a valid IP"),
    ([("user", "a")], [("connection_creation_rate", 1)], "Invalid configuration key connection_creation_rate"),
    ([("ip", "1.2.3.4")], [(PRODUCER_BYTE_RATE, 1)], "Invalid configuration key producer_byte_rate"),
    ([("user", "a")], [("bogus", 1)], "Invalid configuration key bogus"),
    ([("user", "a")], [(PRODUCER_BYTE_RATE, 0)], "Quota producer_byte_rate must be greater than 0"),
    ([("user", "a")], [(PRODUCER_BYTE_RATE, -5)], "must be greater than 0"),
    ([("user", "a")], [(PRODUCER_BYTE_RATE, 1.5)], "producer_byte_rate cannot be a fractional value."),
    ([("ip", None)], [("connection_creation_rate", 2.0**31)], "too large for an INT"),
    ([("user", "a")], [(PRODUCER_BYTE_RATE, 1), (PRODUCER_BYTE_RATE, 2)], "Duplicate quota key"),
])
def test_alter_refuses_what_kafka_refuses(entity, ops, message):
    store = ClientQuotaStore()
    code, got, records = alter(store, entity, *ops)
    assert code == ErrorCode.INVALID_REQUEST and message in got and records == []


def test_alter_refuses_an_entity_named_twice_and_describe_checks_filters():
    store = ClientQuotaStore()
    alt = QuotaAlteration([("user", "a")], [QuotaOp(PRODUCER_BYTE_RATE, 5)])
    records, results = store.decide_alter([alt, alt])
    assert [r[1] for r in results] == [ErrorCode.NONE, ErrorCode.INVALID_REQUEST] and len(records) == 1
    assert store.describe([FilterComponent("user", MATCH_EXACT, None)], False)[0] == ErrorCode.INVALID_REQUEST
    assert store.describe([FilterComponent("ip", MATCH_ANY), FilterComponent("user", MATCH_ANY)],
                          False)[0] == ErrorCode.INVALID_REQUEST


def test_store_snapshot_round_trip_and_bad_records():
    store = ClientQuotaStore()
    alter(store, [("user", None)], (PRODUCER_BYTE_RATE, 100))
    alter(store, [("ip", "10.0.0.1")], ("connection_creation_rate", 5))
    copy = ClientQuotaStore.from_snapshot(store.to_snapshot())
    assert copy.to_snapshot() == store.to_snapshot()
    assert copy.overrides(PRODUCER_BYTE_RATE) == {QuotaEntity(DEFAULT): 100}
    for bad in ({"type": "client_quota"}, {"type": "client_quota", "entity": {}, "key": PRODUCER_BYTE_RATE},
                {"type": "client_quota", "entity": {"user": "a"}, "key": "nope", "value": 1},
                {"type": "acl"}):
        with pytest.raises(ValueError):
            store.replay(bad)


# ------------------------------------------------------------------ connection limits

def test_per_ip_overrides_syntax():
    assert parse_per_ip_overrides("10.0.0.9:0, [::1]:1, host.example:3") == {"10.0.0.9": 0, "::1": 1,
                                                                               "host.example": 3}
    with pytest.raises(ValueError):
        parse_per_ip_overrides("nocount")
