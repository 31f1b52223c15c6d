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


def test_a_work_directory_with_a_comma_is_refused_before_anything_starts(tmp_path):
    # it becomes the brokers' log.dirs (comma-separated, as in Kafka): before, the run failed
    # two seconds in with "no cluster credential" for a directory nobody named
    done = _verify("--workdir", str(tmp_path / "kill,move"), "--records", "1", "--faults", "none")
    assert done.code == 2 and "has a comma" in done.err
    assert not (tmp_path / "kill,move").exists()
