"""What importing oncelog costs where Hypothesis is installed (a test or development environment):
kio registers Hypothesis strategies for its types whenever it can import Hypothesis, 0.6 CPU-s of
each broker, command and PySpark worker start (a command: 1.3 CPU-s before, 0.5 after).
oncelog/__init__.py imports kio with Hypothesis hidden for that one import."""
import subprocess
import sys

PROBE = """
import sys
import oncelog.client, oncelog.broker.net.server, oncelog.spark.source
assert "hypothesis" not in sys.modules, "importing oncelog imported hypothesis"
import hypothesis.strategies   # still importable afterwards
print("ok")
"""


def test_importing_oncelog_leaves_hypothesis_unimported_and_importable():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stderr


def test_a_process_that_imported_hypothesis_first_keeps_kio_s_strategies():
    probe = ("import hypothesis.strategies, oncelog.client, kio.static._phantom as phantom; "
             "assert phantom.hypothesis is not None; print('ok')")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stderr
