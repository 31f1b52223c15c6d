"""`oncelog verify --workload transactions` at CI size: copy loops of oncelog's client and
librdkafka move a few thousand records in transactions (some aborted on purpose, one zombie
fenced per client, half the loops sending one record per request) across a 2-broker cluster
while brokers are killed (-9) and partitions move;
the output read_committed holds every input exactly once and no aborted record."""
import pytest

from oncelog.testing.txn_checker import ALLOWED
from oncelog.testing.verify import VerifyOptions, render, run

# one fault matrix at a time (tests/conftest.py)
pytestmark = [pytest.mark.processes, pytest.mark.xdist_group("faults")]


@pytest.mark.timeout(480)
def test_transactional_copy_under_kills_and_moves(tmp_path):
    # timeout_s bounds the copy, not the test's time (it ends once every input is copied): each
    # librdkafka producer wedged by #5511 costs its loop 40 s before it is abandoned, and a CI
    # run on a loaded machine met two of them and ended 600 inputs short at 120 s
    result = run(VerifyOptions(faults=("kill", "move", "reset"), records=3000, clients=("oncelog", "librdkafka"),
                               seed=7, duration_s=8, timeout_s=240, workload="transactions",
                               workdir=tmp_path))
    text = render(result)
    assert result.ok, text
    r = result.report
    assert r.inputs == 3000 and r.committed_read == 3000, text
    assert r.aborted_seen > 0, text
    for client in ("oncelog", "librdkafka"):
        stats = result.clients[client]
        assert stats.get("transactions committed", 0) > 0, text
        # issue 24: pipelined transactional Produce requests across the two brokers commit too.
        # librdkafka's pipelining loop may commit nothing: a producer wedged by #5511 loses its
        # loop 40 s, the group then gives its partitions to the other loop and the zombie's
        # successor may never get one back (once in CI, 2026-11-29, with every input copied once
        # and no anomaly); that is the client's, reported as such, while oncelog's must commit
        if stats.get("transactions committed by pipelining loops", 0) == 0 and client == "librdkafka":
            print(f"note: librdkafka's pipelining loops committed nothing in this run: {stats}")
        else:
            assert stats.get("transactions committed by pipelining loops", 0) > 0, text
        # the zombie hears that it was fenced, or stops on a fatal error: librdkafka's may be
        # stuck in a call past its timeout (librdkafka #5511); and an EndTxn(COMMIT) at the
        # zombie's epoch that arrives after its successor's InitProducerId fenced and aborted its
        # transaction (CompleteAbort at the next epoch) looks like a retry to the coordinator,
        # which answers INVALID_TXN_STATE (Kafka's TV2 state table), fatal for any client
        stopped = stats.get("zombies stopped by a fatal error", 0)
        assert stats.get("zombies fenced", 0) + stopped == 1, text
    assert result.faults, text
    assert result.broker["WriteTxnMarkers requests (broker to broker)"] > 0, text
    # No transactional batch was refused by its verification: under kills, moves and resets no
    # batch outlives its transaction (the clients wait for their batches before EndTxn; a fenced
    # epoch is INVALID_PRODUCER_EPOCH). Before issue 24, pipelined batches voided each other's
    # checks across the two brokers: 25 such refusals in this run.
    assert result.broker["produce TRANSACTION_ABORTABLE"] == 0, text
    assert result.broker["produce INVALID_TXN_STATE"] == 0, text


def test_transactional_copy_under_pauses(tmp_path):
    """The pause fault (issue 34): brokers, the controller and a copy loop's own client process
    stopped with SIGSTOP for times on both sides of their timeouts, then continued. Each loop
    that was paused past its group session had its partitions copied by another; what it then
    tried to commit is refused, and every input is copied exactly once."""
    result = run(VerifyOptions(faults=("pause",), records=3000, clients=("oncelog", "librdkafka"),
                               seed=3, duration_s=40, timeout_s=120, workload="transactions",
                               workdir=tmp_path))
    text = render(result)
    assert result.ok, text
    r = result.report
    assert r.inputs == 3000 and r.committed_read == 3000, text
    pauses = [e.what for e in result.faults if e.fault == "pause"]
    assert any("broker" in w for w in pauses) and any("past the session" in w for w in pauses), text
    assert any("client" in w for w in pauses), text


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
    assert r.inputs == 2000 and r.committed_read == 2000 and r.ok, text
    assert result.broker["WriteTxnMarkers requests (broker to broker)"] > 0, text
    logs = (tmp_path / "broker1.log").read_text() + (tmp_path / "broker2.log").read_text()
    assert "authenticated User:oncelog-broker (a broker) (SCRAM-SHA-512)" in logs and "on SASL_SSL" in logs


# what a late EndTxn does to a Transactions V1 producer's next transaction: part of it committed
# (or aborted) by the late request, its inputs copied again; and the write cycles Kafka allows
LATE_ENDTXN_CLASSES = {"G1a", "torn-transaction", "lost-write", "duplicate-copy", "lost-input"} | ALLOWED


def test_late_endtxn_is_found_under_transactions_v1(tmp_path):
    """late-endtxn: the proxies hold an EndTxn past the client's request timeout and deliver it
    once the producer's next transaction has written. Under Transactions V1 the epoch does not
    change between transactions, so the coordinator takes it for the open one (Jepsen's finding
    against Kafka, KAFKA-17754): the checker must report what that does, for every client that
    ran TV1, and nothing for a client that ran TV2 (its late EndTxn carries an old epoch).
    Whether a late EndTxn lands inside the next transaction is a race: a run where none did
    is checked and the next seed tried, three at most."""
    for seed in (7, 8, 9):
        result = run(VerifyOptions(faults=("late-endtxn",), records=2000, clients=("oncelog", "librdkafka"),
                                   seed=seed, duration_s=8, timeout_s=120, workload="transactions",
                                   workdir=tmp_path / f"seed{seed}"))
        text = render(result)
        late = {k: v for k, v in result.proxy.items() if k.startswith("late-endtxn: ")}
        assert sum(v for k, v in late.items() if k.endswith(" held")) > 0, text
        by_client = result.report.by_client()
        assert set(by_client) >= {"oncelog TV1", "librdkafka TV1"} or "oncelog TV2" in by_client, text
        tv1 = {who: kinds for who, kinds in by_client.items() if who.endswith(" TV1")}
        for who, kinds in by_client.items():
            if who.endswith(" TV2"):
                assert not kinds, text   # fenced: nothing of the late EndTxn reaches its next transaction
            assert set(kinds) <= LATE_ENDTXN_CLASSES, text   # nothing a late EndTxn does not explain
        if not tv1:
            return
        # the coordinator took late EndTxns, and the checker saw what they did to the next transactions
        if any({"G1a", "torn-transaction", "lost-write"} & set(kinds) for kinds in tv1.values()):
            assert sum(v for k, v in late.items() if k.endswith(" answered NONE")) > 0, text
            assert not result.ok, text
            return
    pytest.fail("in three seeds no late EndTxn landed inside a TV1 producer's next transaction:\n" + text)
