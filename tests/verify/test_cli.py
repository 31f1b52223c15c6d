"""`oncelog verify`'s command line, run as a user runs it."""
from tests.cli.oncelog_cli import Result, oncelog

from oncelog.testing.faults import ALL_FAULTS


def _verify(*args: str) -> Result:
    return oncelog("verify", *args, timeout=60)


def test_all_combines_with_named_faults():
    # the command line: 'all' plus names; only a really unknown name is refused
    done = _verify("--faults", "all,fsync,shortwrite,power-loss,bogus", "--records", "1")
    assert done.code == 2
    assert "unknown faults ['bogus']" in done.err


def test_late_endtxn_is_named_not_part_of_all_and_needs_plaintext():
    txn = ("--workload", "transactions", "--clients", "oncelog,librdkafka", "--records", "1")
    done = _verify(*txn, "--faults", "all,late-endtxn,bogus")
    assert done.code == 2 and "unknown faults ['bogus']" in done.err
    done = _verify(*txn, "--faults", "late-endtxn", "--security-protocol", "SASL_SSL")
    assert done.code == 2 and "late-endtxn needs PLAINTEXT" in done.err
    assert "late-endtxn" not in ALL_FAULTS   # `all` leaves it out: it fails every TV1 client by design
