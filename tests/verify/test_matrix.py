"""The short CI matrix of `oncelog verify`: each fault alone, then all together, each run with
oncelog's producer, librdkafka and kafka-python writing at once against a controller and two
brokers behind fault proxies (the storage faults use the brokers' and controller's storage
failpoints: a failed fsync, a short write, a power cut that keeps only what was fsynced). Fails on any finding the brokers could have caused; oncelog's own
producer must have no finding at all. Third-party clients' own failures are printed, not failed
(the report blames them on the client: see docs/reliability.md)."""
import pytest

from oncelog.testing.faults import ALL_FAULTS, NETWORK_FAULTS
from oncelog.testing.verify import VerifyOptions, render, run

SCENARIOS = [(f,) for f in ALL_FAULTS] + [ALL_FAULTS]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("faults", SCENARIOS, ids=lambda f: f[0] if len(f) == 1 else "all")
def test_no_findings_under(faults, tmp_path):
    result = run(VerifyOptions(faults=faults, records=1500, seed=7, timeout_s=30, workdir=tmp_path))
    print(render(result))
    report = result.report
    assert result.ok, render(result)
    assert not [f for f in report.findings if f.client == "oncelog"], render(result)
    assert report.acked > 0 and report.read >= report.acked
    fired = {e.fault for e in result.faults}
    for fault in faults:
        if fault == "reset":
            assert result.proxy["resets"] > 0, "the reset fault never fired"
        elif fault == "drop":
            assert result.proxy["dropped_responses"] > 0, "the drop fault never fired"
        elif fault not in NETWORK_FAULTS:
            assert fault in fired, f"the {fault} fault never fired"
        if fault in ("fsync", "shortwrite"):  # the failpoint really failed a write or an fsync
            assert any(e.fault == fault and " fired 0x" not in e.what for e in result.faults), render(result)
