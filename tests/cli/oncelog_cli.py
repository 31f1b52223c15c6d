"""Running `oncelog` as a user does: a process of its own (tests/conftest.py refuses tests that
import oncelog.cli), its stdout, stderr and exit code; JSON outputs parsed. Under the suite's fork
server (ONCELOG_TEST_FORK_SERVER=1) the process is forked from one that imported the command line
once, as the brokers are (oncelog.testing.fork_server)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from oncelog.testing import fork_server


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        assert self.code == 0, (self.code, self.err)
        return json.loads(self.out)

    def json_lines(self) -> list:
        assert self.code == 0, (self.code, self.err)
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def one_line_error(self) -> str:
        """The single stderr line of a failed command (no traceback)."""
        assert self.code != 0, self.out
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in self.err, self.err
        assert lines[0].startswith("oncelog: "), lines[0]
        return lines[0]


def oncelog(*args: str, bootstrap: str | None = None, stdin: str | bytes | None = None,
            env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """`oncelog ARGS` (with `--bootstrap-server` appended when given)."""
    argv = [sys.executable, "-m", "oncelog.cli.main", *args]
    if bootstrap is not None:
        argv += ["--bootstrap-server", bootstrap]
    environment = {k: v for k, v in os.environ.items() if k != "ONCELOG_BOOTSTRAP_SERVER"}
    environment.update(env or {})
    data = stdin.encode() if isinstance(stdin, str) else stdin
    if fork_server.enabled():
        p = fork_server.run(argv[3:], input=data or b"", env=environment, timeout=timeout)
    else:
        p = subprocess.run(argv, input=data if data is not None else b"", capture_output=True, timeout=timeout,
                           env=environment)
    return Result(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
