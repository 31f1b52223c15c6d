"""`make run` moves off its ports: PORT and METRICS_PORT (defaults 9092 and 9404), a data
directory of its own for a second broker (./data-PORT), and the in-process controller on a fixed
port with controller.listener. Two brokers from one checkout run side by side."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from oncelog_cli import oncelog

from oncelog.testing.embedded import free_port

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
ONCELOG = [sys.executable, "-m", "oncelog.cli.main"]


def make_run(*variables: str) -> subprocess.Popen:
    return subprocess.Popen(["make", "--no-print-directory", "-C", str(ROOT), "run", *variables],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_serving(proc: subprocess.Popen, timeout_s: float = 60) -> list[str]:
    """The lines `oncelog serve` printed up to "clients connect with" (after "listening on")."""
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        lines.append(line)
        if "oncelog: clients connect with" in line:
            return lines
        assert time.monotonic() < deadline, lines
    pytest.fail("".join(lines))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_two_brokers_from_one_checkout_on_their_own_ports(tmp_path):
    first = (free_port(), free_port())
    second = (free_port(), free_port())
    a = make_run(f"PORT={first[0]}", f"METRICS_PORT={first[1]}", f"DATA={tmp_path / 'a'}")
    b = make_run(f"PORT={second[0]}", f"METRICS_PORT={second[1]}", f"DATA={tmp_path / 'b'}")
    try:
        for proc, (port, metrics) in ((a, first), (b, second)):
            lines = "".join(wait_serving(proc))
            assert f"listening on 127.0.0.1:{port}" in lines
            assert f"metrics on http://127.0.0.1:{metrics}/metrics" in lines
            body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
            assert "oncelog_partitions" in body
            info = oncelog("cluster", "info", "--format", "json", bootstrap=f"127.0.0.1:{port}").json()
            assert info["brokers"][0]["port"] == port
        assert oncelog("topic", "create", "only-on-a", bootstrap=f"127.0.0.1:{first[0]}").code == 0
        listed = oncelog("topic", "list", "--format", "json", bootstrap=f"127.0.0.1:{second[0]}").json()
        assert "only-on-a" not in {t["name"] for t in listed}
    finally:
        stop(a)
        stop(b)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_second_broker_gets_its_own_data_directory_by_default():
    plan = subprocess.run(["make", "--no-print-directory", "-n", "-C", str(ROOT), "run", "PORT=19610",
                           "METRICS_PORT=19611"], capture_output=True, text=True, check=True).stdout
    assert re.search(r"serve --log-dirs \./data-19610 --listeners PLAINTEXT://127\.0\.0\.1:19610", plain(plan))
    assert "metrics.port=19611" in plan
    default = subprocess.run(["make", "--no-print-directory", "-n", "-C", str(ROOT), "run"], capture_output=True,
                             text=True, check=True).stdout
    assert re.search(r"serve --log-dirs \./data --listeners PLAINTEXT://127\.0\.0\.1:9092", plain(default))
    assert "metrics.port=9404" in default


def plain(text: str) -> str:
    return text.replace("\\\n", " ").replace("\t", "")


def test_the_in_process_controller_on_a_fixed_port(tmp_path):
    port, controller = free_port(), free_port()
    proc = subprocess.Popen([
        *ONCELOG, "serve", "--log-dirs", str(tmp_path / "d"), "--listeners", f"PLAINTEXT://127.0.0.1:{port}",
        "--override", f"controller.listener=127.0.0.1:{controller}"], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines = "".join(wait_serving(proc))
        assert f"oncelog: in-process controller on 127.0.0.1:{controller}" in lines
        socket.create_connection(("127.0.0.1", controller), 5).close()
        # taken: a second broker asking for it says so in one line
        r = subprocess.run([*ONCELOG, "serve", "--log-dirs", str(tmp_path / "e"), "--listeners",
                            "PLAINTEXT://127.0.0.1:0", "--override", f"controller.listener=127.0.0.1:{controller}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        assert r.stderr.strip().splitlines()[-1] == (
            f"oncelog: cannot bind the in-process controller to 127.0.0.1:{controller}: the address is in use "
            "(another broker, or another program, listens there); choose another port with controller.listener")
        bad = subprocess.run([*ONCELOG, "serve", "--override", "controller.listener=9093"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "controller.listener" in bad.stderr and "not host:port" in bad.stderr
    finally:
        stop(proc)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_takes_a_controller_port():
    plan = plain(subprocess.run(["make", "--no-print-directory", "-n", "-C", str(ROOT), "run", "CONTROLLER_PORT=19612"],
                                capture_output=True, text=True, check=True).stdout)
    assert "--controller-listener 127.0.0.1:19612" in plan
    default = subprocess.run(["make", "--no-print-directory", "-n", "-C", str(ROOT), "run"], capture_output=True,
                             text=True, check=True).stdout
    assert "--controller-listener" not in default


def test_a_cluster_controller_on_a_fixed_port(tmp_path):
    """`serve --brokers N --controller-listener HOST:PORT` (issue 39, item 10: the cluster's
    controller always took a free port)."""
    controller = free_port()
    proc = subprocess.Popen([
        *ONCELOG, "serve", "--log-dirs", str(tmp_path / "d"), "--listeners", "PLAINTEXT://127.0.0.1:0",
        "--brokers", "1", "--controller-listener", f"127.0.0.1:{controller}"], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            if "oncelog: cluster of 1 brokers" in line:
                assert f"controller on 127.0.0.1:{controller}" in line, line
                break
            assert time.monotonic() < deadline
        else:
            pytest.fail("the cluster did not start")
        socket.create_connection(("127.0.0.1", controller), 5).close()
    finally:
        stop(proc)
