"""A handler bug a broker logged fails the test during which it happened (testing.handler_bugs, the
autouse fixture of tests/conftest.py): from brokers in the test's process and from the log files
of broker processes. Run through pytest itself in a subprocess, as the suite runs it."""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from oncelog.broker.net.dispatch import HANDLER_BUG
from oncelog.testing.handler_bugs import BugWatch


@pytest.mark.handler_bug  # the lines below are bugs to the suite's own watch too
def test_the_watch_sees_bugs_logged_in_process_and_in_broker_log_files(tmp_path):
    old, new = tmp_path / "old.log", tmp_path / "new.log"
    old.write_text(f"ERROR oncelog.broker: {HANDLER_BUG} produce v9 before the watch started\n")
    files = [old]
    watch = BugWatch(lambda: files)
    logging.getLogger("oncelog.broker").error("%s list_groups v4 (correlation id 7)", HANDLER_BUG)
    logging.getLogger("oncelog.broker").error("closing connection from 1.2.3.4: malformed request")
    with open(old, "a") as f:
        f.write(f"ERROR oncelog.broker: {HANDLER_BUG} fetch v12 (correlation id 8)\nTraceback ...\n")
    new.write_text(f"ERROR oncelog.broker: {HANDLER_BUG} metadata v12 (correlation id 9)\n")
    files.append(new)  # a broker process started during the test
    bugs = watch.stop()
    assert [b.split(HANDLER_BUG)[1].split(" (")[0] for b in bugs] == [" list_groups v4", " fetch v12",
                                                                       " metadata v12"]
    # a file's bug comes with the traceback logged under it (CI's output is all a reader gets)
    assert bugs[1].splitlines()[1:] == ["    Traceback ..."]


def test_a_bug_line_carries_its_traceback_up_to_the_next_log_line(tmp_path):
    path = tmp_path / "broker.log"
    watch = BugWatch(lambda: [path])
    path.write_text(f"2026-11-29 03:18:43,023 ERROR oncelog.broker: {HANDLER_BUG} produce v10 (correlation id 9)\n"
                    "Traceback (most recent call last):\n"
                    '  File "partition.py", line 1, in append\n'
                    "ValueError: I/O operation on closed file\n"
                    "2026-11-29 03:18:44,000 INFO oncelog.broker: next line\n")
    (bug,) = watch.stop()
    assert bug.splitlines()[1:] == ["    Traceback (most recent call last):",
                                    '      File "partition.py", line 1, in append',
                                    "    ValueError: I/O operation on closed file"]


TEST_FILE = '''
import logging
import pytest

from oncelog.broker.net.dispatch import HANDLER_BUG


def test_bug():
    logging.getLogger("oncelog.broker").error("%s produce v9 (correlation id 1)", HANDLER_BUG)


@pytest.mark.handler_bug
def test_provoked():
    logging.getLogger("oncelog.broker").error("%s produce v9 (correlation id 2)", HANDLER_BUG)


def test_clean():
    logging.getLogger("oncelog.broker").warning("closing connection from 1.2.3.4: malformed request")
'''


def test_a_test_whose_broker_logged_a_handler_bug_fails(tmp_path):
    (tmp_path / "test_x.py").write_text(textwrap.dedent(TEST_FILE))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "oncelog.testing.handler_bugs", "-o", "markers=handler_bug: on purpose",
                          "--rootdir", str(tmp_path), str(tmp_path / "test_x.py")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "3 passed" in out and "1 error" in out and "ERROR test_x.py::test_bug " in out, out
    assert "a broker logged a handler bug during this test" in out
