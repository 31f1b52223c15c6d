"""`oncelog verify --workload transactions` at CI size: copy loops of oncelog's client and
librdkafka move a few thousand records in transactions (some aborted on purpose, one zombie
fenced per client, half the loops sending one record per request) across a 2-broker cluster
while brokers are killed (-9) and partitions move;
the output read_committed holds every input exactly once and no aborted record."""
import pytest

from oncelog.testing.verify import VerifyOptions, render, run

pytestmark = pytest.mark.processes


def test_transactional_copy_under_kills_and_moves(tmp_path):
    result = run(VerifyOptions(faults=("kill", "move", "reset"), records=3000, clients=("oncelog", "librdkafka"),
                               seed=7, duration_s=8, timeout_s=120, workload="transactions",
                               workdir=tmp_path))
    text = render(result)
    assert result.ok, text
    r = result.report
    assert r.inputs == 3000 and r.committed_read == 3000, text
    assert r.aborted_seen > 0, text
    for client in ("oncelog", "librdkafka"):
        stats = result.clients[client]
        assert stats.get("transactions committed", 0) > 0, text
        # issue 24: pipelined transactional Produce requests across the two brokers commit too
        assert stats.get("transactions committed by pipelining loops", 0) > 0, text
        assert stats.get("zombies fenced", 0) == 1, text
    assert result.faults, text
    assert result.broker["WriteTxnMarkers requests (broker to broker)"] > 0, text
    # No transactional batch was refused by its verification: under kills, moves and resets no
    # batch outlives its transaction (the clients wait for their batches before EndTxn; a fenced
    # epoch is INVALID_PRODUCER_EPOCH). Before issue 24, pipelined batches voided each other's
    # checks across the two brokers: 25 such refusals in this run.
    assert result.broker["produce TRANSACTION_ABORTABLE"] == 0, text
    assert result.broker["produce INVALID_TXN_STATE"] == 0, text


def test_transactional_copy_over_sasl_ssl(tmp_path):
    """The same over SASL_SSL (SCRAM-SHA-512 on TLS) across two brokers: every transaction whose
    partitions are led by the other broker needs WriteTxnMarkers and KIP-890 verifications between
    the brokers, which log in to each other with the cluster credential over TLS."""
    result = run(VerifyOptions(faults=("kill", "move"), records=2000, clients=("oncelog", "librdkafka"),
                               seed=3, duration_s=8, timeout_s=120, workload="transactions",
                               security_protocol="SASL_SSL", workdir=tmp_path))
    text = render(result)
    assert result.ok, text
    r = result.report
    assert r.inputs == 2000 and r.committed_read == 2000 and not r.findings, text
    assert result.broker["WriteTxnMarkers requests (broker to broker)"] > 0, text
    logs = (tmp_path / "broker1.log").read_text() + (tmp_path / "broker2.log").read_text()
    assert "authenticated User:oncelog-broker (a broker) (SCRAM-SHA-512)" in logs and "on SASL_SSL" in logs
