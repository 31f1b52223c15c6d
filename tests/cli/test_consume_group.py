"""`oncelog consume -g G` joins the group: two console consumers of one group share a topic's
partitions, as kafka-console-consumer --group and `rpk topic consume -g` do (issue 39, item 6);
and `-o` takes times before now and ISO times (item 8)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from oncelog_cli import oncelog

from oncelog.client import Producer

pytestmark = pytest.mark.processes


class Console:
    """`oncelog consume ... --format json` running, its output lines collected by a thread."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "ONCELOG_BOOTSTRAP_SERVER"}
        self.proc = subprocess.Popen([sys.executable, "-m", "oncelog.cli.main", "consume", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.records: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.records.append(json.loads(line))

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(10)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read().decode(errors="replace")


def _members(b: str, g: str) -> list[dict]:
    r = oncelog("group", "describe", g, "--format", "json", bootstrap=b)
    return r.json()["members"] if r.code == 0 else []


def test_two_console_consumers_of_a_group_share_the_partitions(shared_broker, unique_topic):
    b, t, g = shared_broker.bootstrap, unique_topic, f"{unique_topic}-g"
    assert oncelog("topic", "create", t, "-p", "2", bootstrap=b).code == 0
    consoles = [Console(t, "-g", g, "--format", "json", "--bootstrap-server", b) for _ in range(2)]
    try:
        # both members joined and each holds one partition
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            members = _members(b, g)
            if len(members) == 2 and all(len(m["assignment"]) == 1 for m in members):
                break
            assert all(c.proc.poll() is None for c in consoles), [c.stop() for c in consoles]
            time.sleep(0.2)
        else:
            pytest.fail(f"the two consumers never shared the partitions: {_members(b, g)}")
        with Producer({"bootstrap.servers": b}) as p:
            for i in range(40):
                p.send(t, value=f"v{i}".encode(), partition=i % 2)
            p.flush()
        deadline = time.monotonic() + 60
        while sum(len(c.records) for c in consoles) < 40 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stopped = [c.stop() for c in consoles]
    assert [code for code, _err in stopped] == [0, 0], stopped
    seen = [{(r["partition"], r["offset"]) for r in c.records} for c in consoles]
    # each printed one partition's records, every record once between them
    assert [len({p for p, _o in s}) for s in seen] == [1, 1]
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == {(i % 2, i // 2) for i in range(40)}
    # what they printed was committed, and they left the group
    d = oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()
    assert d["state"] == "Empty" and [p["lag"] for p in d["partitions"]] == [0, 0]

    # a third consumer of the group starts from those commits: nothing more to print
    assert oncelog("consume", t, "-g", g, "-e", bootstrap=b).out == ""
    # with -g, -o moves nothing: it is refused unless start or end (group seek moves groups)
    r = oncelog("consume", t, "-g", g, "-o", "5", bootstrap=b)
    assert r.code == 2 and "with -g the group's committed offsets say where to start" in r.one_line_error()


def test_consume_from_a_time_before_now_or_an_iso_time(shared_broker, unique_topic):
    b, t = shared_broker.bootstrap, unique_topic
    assert oncelog("topic", "create", t, bootstrap=b).code == 0
    now = int(time.time() * 1000)
    with Producer({"bootstrap.servers": b}) as p:
        p.send(t, value=b"old", timestamp=now - 3 * 3_600_000)     # three hours ago
        p.send(t, value=b"recent", timestamp=now - 60_000)         # a minute ago
        p.flush()
    assert oncelog("consume", t, "-e", "-o", "-1h", bootstrap=b).out == "recent\n"
    assert oncelog("consume", t, "-e", "-o", "@-4h", bootstrap=b).out == "old\nrecent\n"
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((now - 2 * 3_600_000) / 1000))
    assert oncelog("consume", t, "-e", "-o", iso, bootstrap=b).out == "recent\n"
    r = oncelog("consume", t, "-e", "-o", "yesterday", bootstrap=b)
    assert r.code == 2 and "a time before now such as -1h" in r.one_line_error()
