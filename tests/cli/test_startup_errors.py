"""A broker that cannot start says why in one line on stderr, naming the cause and what to do,
and exits non-zero; a traceback only with --log-level DEBUG. Each case was a traceback of 38 to
58 lines, the metrics port's after the broker had registered with its controller."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from oncelog.testing.embedded import ControllerProcess, broker_overrides, free_port

pytestmark = pytest.mark.processes


def serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oncelog.cli.main", "serve", *args], capture_output=True, text=True,
                          timeout=timeout)


def one_line(r: subprocess.CompletedProcess) -> str:
    """The failure's line: stderr holds it alone apart from INFO log lines of the start."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if " INFO " not in line]
    assert len(lines) == 1, r.stderr
    assert "listening on" not in r.stdout   # it never served
    return lines[0]


@pytest.fixture
def taken_port():
    """A port something else listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_listener_port_in_use(tmp_path, taken_port):
    line = one_line(serve("--log-dirs", str(tmp_path / "d"), "--listeners", f"PLAINTEXT://127.0.0.1:{taken_port}"))
    assert line == (f"oncelog: cannot bind listener PLAINTEXT to 127.0.0.1:{taken_port}: the address is in use "
                    "(another broker, or another program, listens there); choose another port with listeners")


def test_metrics_port_in_use_fails_before_the_broker_registers(tmp_path, taken_port):
    with ControllerProcess(tmp_path / "meta") as controller:
        overrides = {**broker_overrides(controller, 1), "metrics.port": str(taken_port)}
        args = [a for k, v in overrides.items() for a in ("--override", f"{k}={v}")]
        line = one_line(serve("--log-dirs", str(tmp_path / "d"), "--listeners", "PLAINTEXT://127.0.0.1:0", *args))
        assert f"cannot bind the metrics endpoint to 127.0.0.1:{taken_port}" in line
        assert "choose another port with metrics.port" in line
        assert "registered" not in controller.log_tail(100_000)   # the controller never heard of it


def test_log_dirs_naming_a_file(tmp_path):
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    line = one_line(serve("--log-dirs", str(f), "--listeners", "PLAINTEXT://127.0.0.1:0"))
    assert line == f"oncelog: {f} is a file, not a directory: log.dirs (--log-dirs) must name directories"


def test_an_unwritable_directory(tmp_path):
    if os.geteuid() == 0:   # root writes anywhere but in sysfs
        target = "/sys/oncelog-unwritable/data"
        try:
            os.makedirs(target)
        except PermissionError:
            pass
        else:
            pytest.skip("running as root where /sys is writable: no directory is unwritable")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        target = str(locked / "data")
    line = one_line(serve("--log-dirs", target, "--listeners", "PLAINTEXT://127.0.0.1:0"))
    assert line.startswith("oncelog: no permission to write /") and "choose another --log-dirs" in line


def test_an_unknown_log_level():
    r = serve("--log-level", "LOUD")
    line = one_line(r)
    assert r.returncode == 2
    assert line.startswith("oncelog: Invalid value for '--log-level': 'LOUD' is not one of 'debug', 'info'")


def test_a_truncated_topic_registry(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "__oncelog_topics.json").write_text('[{"name": "orders", "topic_id": "8c1f')
    line = one_line(serve("--log-dirs", str(data), "--listeners", "PLAINTEXT://127.0.0.1:0"))
    assert line.startswith(f"oncelog: {data / '__oncelog_topics.json'} is damaged (JSONDecodeError")
    assert "restore it from a backup" in line


def test_a_traceback_only_with_log_level_debug(tmp_path, taken_port):
    r = serve("--log-dirs", str(tmp_path / "d"), "--listeners", f"PLAINTEXT://127.0.0.1:{taken_port}",
              "--log-level", "DEBUG")
    assert r.returncode != 0 and "Traceback" in r.stderr and "address already in use" in r.stderr.lower()
    assert r.stderr.strip().splitlines()[-1].startswith("oncelog: cannot bind listener PLAINTEXT")


def test_a_good_start_still_starts(tmp_path):
    """The same command with a free port serves (the failures above are the ports' and files')."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "oncelog.cli.main", "serve", "--log-dirs", str(tmp_path / "d"),
                             "--listeners", f"PLAINTEXT://127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "listening on" in line:
                assert f"127.0.0.1:{port}" in line
                break
        else:
            pytest.fail(f"exited with {proc.wait()}")
    finally:
        proc.terminate()
        proc.wait(30)
