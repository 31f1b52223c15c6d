"""`oncelog verify`'s command line, run as a user runs it."""
import subprocess
import sys


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oncelog.cli.main", "verify", *args],
                          capture_output=True, text=True, timeout=60)


def test_all_combines_with_named_faults():
    # the command line: 'all' plus names; only a really unknown name is refused
    done = _verify("--faults", "all,fsync,shortwrite,power-loss,bogus", "--records", "1")
    assert done.returncode == 2
    assert "unknown faults ['bogus']" in done.stderr
