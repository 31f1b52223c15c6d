"""`oncelog consume --share-group G` (KIP-932): console consumers of one share group share the
records, each printed by one of them (a newcomer saw two `consume -g` each print all 40: a
classic group id only names where offsets are committed); `oncelog share-group list|describe`."""
from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from oncelog_cli import oncelog

from oncelog.protocol.api import ApiKey
from oncelog.testing.raw_client import RawConnection
from oncelog.testing.share_verify import set_group_configs

pytestmark = pytest.mark.processes


def test_two_share_group_consoles_print_each_record_once(shared_broker, unique_topic):
    b, t, g = shared_broker.bootstrap, unique_topic, f"{unique_topic}-sharers"
    assert oncelog("topic", "create", t, bootstrap=b).code == 0
    _configure_earliest(b, g)
    assert oncelog("produce", t, stdin="".join(f"v{i}\n" for i in range(40)), bootstrap=b).code == 0
    argv = [sys.executable, "-m", "oncelog.cli.main", "consume", t, "--share-group", g, "-n", "20",
            "--format", "%o\\n", "--bootstrap-server", b]
    consoles = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [c.communicate(timeout=120) for c in consoles]
    assert all(c.returncode == 0 for c in consoles), [e for _o, e in outs]
    printed = [[int(x) for x in o.split()] for o, _e in outs]
    assert all(len(p) == 20 for p in printed)
    assert sorted(printed[0] + printed[1]) == list(range(40))
    listed = {x["group"]: x["state"] for x in oncelog("share-group", "list", "--format", "json", bootstrap=b).json()}
    assert listed.get(g) == "Empty"
    d = oncelog("share-group", "describe", g, "--format", "json", bootstrap=b).json()
    assert (d["type"], d["state"], d["members"]) == ("share", "Empty", [])
    assert oncelog("share-group", "delete", g, bootstrap=b).code == 0
    assert g not in {x["group"] for x in oncelog("share-group", "list", "--format", "json", bootstrap=b).json()}


def _configure_earliest(b: str, group: str) -> None:
    with RawConnection(b) as raw:
        set_group_configs(raw, group, {"share.auto.offset.reset": "earliest"})


def _consume(b: str, topic: str, group: str, n: int) -> list[int]:
    r = oncelog("consume", topic, "--share-group", group, "-n", str(n), "--format", "%o\\n", bootstrap=b)
    assert r.code == 0, r.err
    return [int(x) for x in r.out.split()]


def test_reset_offsets_and_delete_offsets_as_kafka_share_groups(shared_broker, unique_topic):
    """kafka-share-groups --describe --offsets, --reset-offsets (--dry-run / --execute) and
    --delete-offsets: APIs 90-92 from the command line, with their JSON and exit codes."""
    b, t, g = shared_broker.bootstrap, unique_topic, f"{unique_topic}-g"
    assert oncelog("topic", "create", t, bootstrap=b).code == 0
    _configure_earliest(b, g)
    assert oncelog("produce", t, stdin="".join(f"v{i}\n" for i in range(40)), bootstrap=b).code == 0
    assert _consume(b, t, g, 10) == list(range(10))
    d = oncelog("share-group", "describe", g, "--format", "json", bootstrap=b).json()
    assert d["partitions"] == [{"topic": t, "partition": 0, "start_offset": 10, "lag": 30}]
    text = oncelog("share-group", "describe", g, "--offsets", bootstrap=b)
    assert text.code == 0 and "START-OFFSET" in text.out and "MEMBER" not in text.out
    # Kafka's rules: one of --dry-run/--execute, one scenario, --topic or --all-topics (usage: 2)
    for args in (["--to-earliest", "--topic", t], ["--to-earliest", "--to-latest", "--topic", t, "--execute"],
                 ["--to-earliest", "--execute"], ["--to-offset", "3", "--topic", f"{t}:x", "--execute"]):
        r = oncelog("share-group", "reset-offsets", g, *args, bootstrap=b)
        assert r.code == 2, (args, r.out, r.err)
        r.one_line_error()
    plan = oncelog("share-group", "reset-offsets", g, "--to-offset", "5", "--topic", t, "--dry-run",
                   "--format", "json", bootstrap=b).json()
    assert plan == [{"topic": t, "partition": 0, "previous_offset": 10, "new_offset": 5}]
    assert oncelog("share-group", "describe", g, "--format", "json", bootstrap=b).json()["partitions"][0][
        "start_offset"] == 10   # a dry run changes nothing
    done = oncelog("share-group", "reset-offsets", g, "--to-offset", "5", "--topic", f"{t}:0", "--execute",
                   "--format", "json", bootstrap=b).json()
    assert done == plan
    assert oncelog("share-group", "describe", g, "--format", "json", bootstrap=b).json()["partitions"] == [
        {"topic": t, "partition": 0, "start_offset": 5, "lag": 35}]
    assert _consume(b, t, g, 3) == [5, 6, 7]
    # a far future time finds no record: the log end; --all-topics: the group's share-partitions
    r = oncelog("share-group", "reset-offsets", g, "--to-datetime", "2999-01-01T00:00:00", "--all-topics",
                "--execute", "--format", "json", bootstrap=b).json()
    assert [(x["previous_offset"], x["new_offset"]) for x in r] == [(8, 40)]
    r = oncelog("share-group", "reset-offsets", g, "--to-earliest", "--all-topics", "--execute", bootstrap=b)
    assert r.code == 0 and "40" in r.out and "0" in r.out
    # a member running: refused (exit 1), as Kafka's tool refuses a group that is not empty
    member = str(uuid.uuid4())
    hb = RawConnection(b).call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, group_id=g, member_id=member, member_epoch=0,
                               rack_id=None, subscribed_topic_names=(t,))
    assert int(hb.error_code) == 0
    r = oncelog("share-group", "reset-offsets", g, "--to-latest", "--all-topics", "--execute", bootstrap=b)
    assert r.code == 1 and "members" in r.one_line_error()
    assert oncelog("share-group", "delete-offsets", g, "--topic", t, bootstrap=b).code == 1
    RawConnection(b).call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, group_id=g, member_id=member, member_epoch=-1,
                          rack_id=None, subscribed_topic_names=None)
    # delete-offsets: the topic's state goes; a second time there is none (exit 1, Kafka's error named)
    assert oncelog("share-group", "delete-offsets", g, "--topic", t, "--format", "json", bootstrap=b).json() == [
        {"topic": t, "error": None}]
    assert oncelog("share-group", "describe", g, "--format", "json", bootstrap=b).json()["partitions"] == []
    r = oncelog("share-group", "delete-offsets", g, "--topic", t, bootstrap=b)
    assert r.code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in r.out + r.err
    # the next consumer of the group starts at share.auto.offset.reset again (earliest)
    assert _consume(b, t, g, 2) == [0, 1]
