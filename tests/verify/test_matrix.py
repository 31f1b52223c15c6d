"""The short CI matrix of `oncelog verify`: each fault alone, then all together, each run with
oncelog's producer, librdkafka and kafka-python writing at once against a controller and two
brokers behind fault proxies (the storage faults use the brokers' and controller's storage
failpoints: a failed fsync, a short write, a power cut that keeps only what was fsynced). Fails on
any finding the brokers could have caused; oncelog's own producer must have no finding at all.
Third-party clients' own failures are printed, not failed (the report blames them on the client:
see docs/reliability.md). The client-pressure fault (giveup) has its own run, oncelog's producer
alone.

In CI (`make test`) the `all` scenario runs every fault but pause at once and asserts each one fired; each
fault alone is the full tier's (`make test-all`)."""
import pytest
from tests.tiers import FULL

from oncelog.testing.faults import ALL_FAULTS, CLIENT_FAULTS, NETWORK_FAULTS
from oncelog.testing.verify import VerifyOptions, render, run

# one fault matrix at a time (tests/conftest.py)
pytestmark = [pytest.mark.processes, pytest.mark.xdist_group("faults")]

# In CI the `all` scenario leaves the pause out: with a broker stopped past the clients' sessions,
# third-party clients may stall for the rest of the run and the faults that wait for writes (the
# fsync and short-write failpoints) then never fire (2 runs of 2 after pause joined). Pause runs in
# CI in tests/testing/test_txn_verify.py (copy loops under pauses) and the fencing reproductions
# of tests/controller/test_pause_fencing.py; the full tier runs `all` with it, and pause alone.
ALL_IN_TIER = ALL_FAULTS if FULL else tuple(f for f in ALL_FAULTS if f != "pause")
SCENARIOS = [pytest.param((f,), marks=pytest.mark.slow) for f in ALL_FAULTS if f not in CLIENT_FAULTS] + [ALL_IN_TIER]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("faults", SCENARIOS, ids=lambda f: f[0] if len(f) == 1 else "all")
def test_no_findings_under(faults, tmp_path):
    # 60 s of delivery timeout: on CI's loaded machine (4 test workers on 2 cores) kafka-python was
    # once still waiting for 103 answers when 30 s ran out
    result = run(VerifyOptions(faults=faults, records=1500, seed=7, timeout_s=60, workdir=tmp_path))
    print(render(result))
    report = result.report
    # No finding a broker could have caused, and none at all for oncelog's producer
    # (docs/reliability.md). The third-party clients' own failures under this mix are theirs and
    # are reported, not failed on: librdkafka's duplicates re-sent under a bumped epoch
    # (`restamped`, librdkafka #4953), its fatal UNKNOWN_PRODUCER_ID on a retried batch after
    # the expiry fault, kafka-python's missing KIP-360 handling, and confluent-kafka's SystemError
    # from inside a callback (each seen in CI's loaded runs).
    assert report.broker_ok, render(result)
    assert not [f for f in report.findings if f.client == "oncelog"], render(result)
    assert report.acked > 0 and report.read >= report.acked
    fired = {e.fault for e in result.faults}
    for fault in faults:
        if fault == "reset":
            assert result.proxy["resets"] > 0, "the reset fault never fired"
        elif fault == "drop":
            assert result.proxy["dropped_responses"] > 0, "the drop fault never fired"
        elif fault not in NETWORK_FAULTS + CLIENT_FAULTS:
            assert fault in fired, f"the {fault} fault never fired"
        if fault in ("fsync", "shortwrite"):  # the failpoint really failed a write or an fsync
            assert any(e.fault == fault and " fired 0x" not in e.what for e in result.faults), render(result)


@pytest.mark.timeout(300)
def test_batches_given_up_with_unknown_outcomes_are_never_written_twice(tmp_path):
    """giveup: one retry and 20% of the answers dropped after the broker wrote, several small
    batches per partition on the wire. Batches are given up with their outcome unknown; none of
    what follows them may be written twice (the producer without the resolution of unknown
    sequences wrote 182 duplicates in 10,000 records, seed 7), and no record it reported as not
    written may be in the log."""
    result = run(VerifyOptions(faults=("giveup",), clients=("oncelog",), records=3000, seed=7,
                               timeout_s=30, workdir=tmp_path))
    print(render(result))
    report, stats = result.report, result.clients["oncelog"]
    assert report.ok, render(result)
    assert stats.get("given_up", 0) > 0, "no batch was given up with its outcome unknown"
    assert report.acked > 0 and report.read > report.acked   # some failed records were written


@pytest.mark.timeout(420)
def test_no_findings_over_sasl_ssl(tmp_path):
    """The network faults and a broker kill with every client on SASL_SSL (SCRAM-SHA-512): the
    proxies pass TLS through and fault it per record."""
    result = run(VerifyOptions(faults=("reset", "drop", "kill"), records=1500, seed=7, timeout_s=30,
                               workdir=tmp_path, security_protocol="SASL_SSL"))
    print(render(result))
    assert result.ok, render(result)
    assert not [f for f in result.report.findings if f.client == "oncelog"], render(result)
    assert result.report.acked > 0 and result.report.read >= result.report.acked
    assert result.proxy["resets"] > 0 and result.proxy["dropped_responses"] > 0, render(result)
    assert "SASL_SSL" in (tmp_path / "broker1.log").read_text()
