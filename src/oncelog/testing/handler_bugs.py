"""Handler bugs a broker logged during a test. A broker answers a request whose handler raised
with UNKNOWN_SERVER_ERROR and carries on (`Dispatcher.handle`), so the client may never notice;
the broker's log line (`HANDLER_BUG`) is what must fail the test.

`BugWatch` collects those lines from brokers in this process (a handler on the `oncelog.broker`
logger) and from the log files of broker processes (`embedded.broker_log_files`): the lines
written since it started. `no_handler_bugs` is the autouse fixture that fails a test during which
one was logged, unless the test is marked `handler_bug` (it provokes one on purpose).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from oncelog.broker.net.dispatch import HANDLER_BUG
from oncelog.testing.embedded import broker_log_files


class BugWatch(logging.Handler):
    def __init__(self, log_files: Callable[[], Iterable[Path]] = broker_log_files) -> None:
        super().__init__(logging.ERROR)
        self._log_files = log_files
        self._found: list[str] = []
        self._offsets = {path: _size(path) for path in log_files()}
        logging.getLogger("oncelog.broker").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if HANDLER_BUG in message:
            self._found.append(message)

    def stop(self) -> list[str]:
        """The handler-bug lines logged since the watch started."""
        logging.getLogger("oncelog.broker").removeHandler(self)
        found = list(self._found)
        for path in self._log_files():
            offset = self._offsets.get(path, 0)
            if _size(path) > offset:
                found.extend(_bug_lines(path, offset))
        return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _bug_lines(path: Path, offset: int) -> Iterator[str]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if HANDLER_BUG in line:
            # the traceback log.exception wrote under it: what CI prints is all a reader has
            trace = []
            for follow in lines[i + 1:i + 1 + _TRACEBACK_LINES]:
                if _LOG_LINE.match(follow):
                    break
                trace.append("    " + follow)
            yield "\n".join([f"{path}: {line.strip()}", *trace])


# a log line of its own (not a traceback's): it starts with the record's date
_LOG_LINE = re.compile(r"\d{4}-\d{2}-\d{2} ")
_TRACEBACK_LINES = 60


@pytest.fixture(autouse=True)
def no_handler_bugs(request: pytest.FixtureRequest) -> Iterator[None]:
    watch = BugWatch()
    yield
    bugs = watch.stop()
    if bugs and request.node.get_closest_marker("handler_bug") is None:
        pytest.fail("a broker logged a handler bug during this test:\n" + "\n".join(bugs), pytrace=False)
