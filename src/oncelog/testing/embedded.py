"""Run `oncelog serve` as a subprocess for tests, benchmarks and `oncelog verify`: a real broker
process with real files, that can be killed with SIGKILL and restarted on the same data."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_LISTENING = re.compile(r"oncelog: listening on ([\d.]+):(\d+)")
_LOG_FILES: dict[Path, None] = {}  # of every broker process started, in order


def broker_log_files() -> list[Path]:
    """The log file of every broker process started so far (`testing.handler_bugs` reads them)."""
    return list(_LOG_FILES)


def wait_for_line(proc: subprocess.Popen, pattern: re.Pattern, timeout_s: float) -> re.Match | None:
    """Reads the process's stdout until a line matches `pattern` (None: it exited or the time ran
    out), then keeps draining stdout in the background so the process never blocks on the pipe."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while True:
        line = proc.stdout.readline().decode(errors="replace")
        match = pattern.search(line)
        if match:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return match
        if not line or time.monotonic() > deadline:
            return None


class BrokerProcess:
    def __init__(self, data_dir: str | Path, overrides: dict[str, str] | None = None,
                 port: int = 0, host: str = "127.0.0.1", log_file: str | Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.overrides = dict(overrides or {})
        self.env = dict(env or {})  # e.g. ONCELOG_FAILPOINTS for the next start
        self.host, self.port = host, port
        self.log_file = Path(log_file) if log_file else self.data_dir.parent / f"{self.data_dir.name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "oncelog.cli.main", "serve", "--log-dirs", str(self.data_dir),
               "--listeners", f"PLAINTEXT://{self.host}:{self.port}"]
        for name, value in self.overrides.items():
            cmd += ["--override", f"{name}={value}"]
        return cmd

    def start(self, timeout_s: float = 30) -> "BrokerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file, "ab")
        _LOG_FILES[self.log_file] = None
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        log.close()
        match = wait_for_line(self.proc, _LISTENING, timeout_s)
        if match is None:
            self.kill()
            raise RuntimeError(f"oncelog serve did not start; log tail:\n{self.log_tail()}")
        self.host, self.port = match.group(1), int(match.group(2))
        return self

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, as after a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout_s: float = 20) -> int | None:
        """SIGTERM and wait: the clean shutdown path (Ctrl-C does the same)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def restart(self, clean: bool = True) -> "BrokerProcess":
        """Same data directory and port."""
        self.stop() if clean else self.kill()
        return self.start()

    def __enter__(self) -> "BrokerProcess":
        return self.start() if not self.running else self

    def __exit__(self, *exc) -> None:
        self.stop()
