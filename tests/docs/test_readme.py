"""Every shell and Python snippet of the README runs as written, in order, against the broker
`make run` starts (the Spark example included), from a directory where `.venv` is the
checkout's virtual environment, as a user who followed the README has it.

What the harness adds, and nothing else: the README's ports (9092 for `make run`'s broker, 9093
and up for the brokers its snippets start, 9404 for metrics) become free ports, so the run does
not collide with a broker already on this machine; $ONCELOG_BOOTSTRAP_SERVER names `make run`'s
broker for the command line's default; PYSPARK_PYTHON is unset, as in a plain session.

A snippet is preceded by a directive where it cannot run as a plain step:
    <!-- docs-test: skip (why) -->      not run (installs, or runs for minutes); the reason names
                                        the tests that cover it instead
    <!-- docs-test: background -->     each line starts a server, left running until the end
                                        (it must print "listening on")"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from oncelog.testing.embedded import free_port

pytestmark = [pytest.mark.processes, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- docs-test: (?P<directive>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M)
PORTS = re.compile(r"(?<=[:=])(909[2-9]|9404)\b")


@dataclass
class Snippet:
    line: int
    lang: str
    body: str
    directive: str | None

    def where(self) -> str:
        return f"README.md line {self.line} ({self.lang})"


def snippets(text: str) -> list[Snippet]:
    out = []
    for m in BLOCK.finditer(text):
        if m.group("lang") in ("sh", "python"):
            out.append(Snippet(text.count("\n", 0, m.start("body")), m.group("lang"), m.group("body"),
                               m.group("directive")))
    return out


def commands(body: str) -> list[str]:
    """A background block's commands, continuation lines joined."""
    return [c.strip() for c in body.replace("\\\n", " ").splitlines() if c.strip()]


class Runner:
    def __init__(self, work: Path, ports: dict[str, str]) -> None:
        self.work, self.ports = work, ports
        self.servers: list[subprocess.Popen] = []
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
        self.env.update({"ONCELOG_BOOTSTRAP_SERVER": f"127.0.0.1:{ports['9092']}", "SPARK_LOCAL_IP": "127.0.0.1"})

    def localize(self, text: str) -> str:
        return PORTS.sub(lambda m: self.ports[m.group(1)], text)

    def start(self, argv: list[str] | str, what: str, until: str = "listening on") -> None:
        proc = subprocess.Popen(argv, shell=isinstance(argv, str), cwd=self.work, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.servers.append(proc)
        assert proc.stdout is not None
        seen = []
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            seen.append(line)
            if until in line:
                return
            assert time.monotonic() < deadline, f"{what}: no {until!r} in 90 s:\n{''.join(seen)}"
        pytest.fail(f"{what} exited ({proc.wait()}) before serving:\n{''.join(seen)}")

    def run(self, s: Snippet) -> None:
        body = self.localize(s.body)
        if s.directive == "background":
            for command in commands(body):
                self.start(command, f"{s.where()}: {command}")
            return
        if s.lang == "sh":
            argv = ["bash", "-e", "-o", "pipefail", "-c", body]
        else:
            script = self.work / f"snippet_{s.line}.py"
            script.write_text(body)
            argv = [sys.executable, str(script)]
        r = subprocess.run(argv, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{s.where()} failed ({r.returncode}):\n{body}\n--- stdout\n{r.stdout[-2000:]}" \
                                  f"\n--- stderr\n{r.stderr[-4000:]}"

    def stop(self) -> None:
        for proc in reversed(self.servers):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


def test_every_snippet_is_marked_or_runs():
    """No snippet escapes the run by its language or a directive the harness does not know."""
    text = README.read_text()
    found = snippets(text)
    assert len(found) == len(re.findall(r"^```(?:sh|python)\n", text, re.M)) > 10
    for s in found:
        assert s.directive is None or s.directive == "background" or re.fullmatch(r"skip \(.+\)", s.directive), \
            (s.where(), s.directive)
    assert set(re.findall(r"^```(\w+)\n", text, re.M)) <= {"sh", "python"}


def test_the_readme_runs_as_written(tmp_path):
    if shutil.which("make") is None or shutil.which("openssl") is None:
        pytest.skip("the README uses make and openssl")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(ROOT / ".venv")
    ports = {str(p): str(free_port()) for p in (*range(9092, 9100), 9404)}
    runner = Runner(work, ports)
    try:
        runner.start(["make", "--no-print-directory", "-C", str(ROOT), "run", f"PORT={ports['9092']}",
                      f"METRICS_PORT={ports['9404']}", f"DATA={work / 'data'}"], "make run")
        for s in snippets(README.read_text()):
            if s.directive and s.directive.startswith("skip"):
                continue
            runner.run(s)
    finally:
        runner.stop()
