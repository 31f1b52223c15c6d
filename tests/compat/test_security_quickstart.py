"""docs/security.md's secure quick start, run as written: the blocks marked `<!-- quickstart:... -->`
in order, in an empty directory, with `oncelog serve` as installed (the port is the one change: a
free one instead of 9093/9094, so that runs do not collide)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_kafkajs import kafkajs  # noqa: F401 - the fixture

from oncelog.testing.embedded import free_port, wait_for_line

pytestmark = pytest.mark.processes

DOC = Path(__file__).parents[2] / "docs" / "security.md"


def blocks() -> dict[str, str]:
    text = DOC.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- quickstart:(\S+) -->\n```\w*\n(.*?)```", text, re.S)}


def oncelog_on_path(tmp_path: Path) -> dict[str, str]:
    """`oncelog` as the shell finds it after `pip install`: this interpreter's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "oncelog"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m oncelog.cli.main \"$@\"\n")
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}


def serve(script: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=open(cwd / "serve.log", "ab"), start_new_session=True)
    if wait_for_line(proc, re.compile(r"oncelog: listening on"), 60) is None:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError((cwd / "serve.log").read_text()[-3000:])
    return proc


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)


def test_the_secure_quick_start_works_as_written(tmp_path, kafkajs):  # noqa: F811 - the fixture
    b = blocks()
    assert {"sh", "serve", "py", "js", "mtls"} <= set(b), sorted(b)
    env = oncelog_on_path(tmp_path)
    port = str(free_port())
    subprocess.run(["bash", "-ec", b["sh"]], cwd=tmp_path, env=env, check=True, capture_output=True)
    proc = serve(b["serve"].replace("9093", port), tmp_path, env)
    try:
        r = subprocess.run([sys.executable, "-c", b["py"].replace("9093", port)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "hello from confluent-kafka" in r.stdout
        r = subprocess.run(["node", "-e", b["js"].replace("9093", port)], cwd=tmp_path,
                           env={**env, "NODE_PATH": str(kafkajs)}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "sent" in r.stdout, r.stderr[-3000:]
    finally:
        stop(proc)
    mtls_port = str(free_port())
    proc = serve(b["mtls"].replace("9094", mtls_port), tmp_path, env)
    try:
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": f"127.0.0.1:{mtls_port}", "security.protocol": "SSL",
                      "ssl.ca.location": str(tmp_path / "ca.pem"),
                      "ssl.certificate.location": str(tmp_path / "alice.crt"),
                      "ssl.key.location": str(tmp_path / "alice.key")})
        p.produce("orders", b"hello over mutual TLS")
        assert p.flush(30) == 0
    finally:
        stop(proc)


def test_the_readme_shows_the_same_commands():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    b = blocks()
    assert b["sh"] in readme and b["serve"] in readme
