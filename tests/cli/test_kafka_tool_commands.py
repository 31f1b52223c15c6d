"""The commands an operator coming from kafka-*.sh and rpk looks for (issue 39, item 8): the
connection options before the command, group seek by time / duration / shift, delete-offsets,
describe of several groups, topic delete-records (trim-prefix), `admin pid-blocks --format json`,
and shell completion; each against a real broker, with its JSON and exit codes."""
from __future__ import annotations

import os
import time

import pytest
from oncelog_cli import oncelog

from oncelog.client import Producer

pytestmark = pytest.mark.processes

HOUR = 3_600_000


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def test_connection_options_go_before_the_command(shared_broker, unique_topic):
    b, t = shared_broker.bootstrap, unique_topic
    assert oncelog("--bootstrap-server", b, "topic", "create", t).code == 0
    listed = oncelog("-b", b, "topic", "list", "--format", "json")
    assert t in {x["name"] for x in listed.json()}
    # the command's own wins over the one before it
    r = oncelog("--bootstrap-server", "127.0.0.1:1", "topic", "list", "--format", "json", bootstrap=b)
    assert t in {x["name"] for x in r.json()}
    r = oncelog("--bootstrap-server", "127.0.0.1:1", "topic", "list")
    assert r.code == 3 and "cannot reach 127.0.0.1:1" in r.one_line_error()


def test_group_seek_by_time_duration_and_shift(shared_broker, unique_topic):
    b, t, g = shared_broker.bootstrap, unique_topic, f"{unique_topic}-g"
    assert oncelog("topic", "create", t, bootstrap=b).code == 0
    now = int(time.time() * 1000)
    with Producer({"bootstrap.servers": b}) as p:
        for i in range(10):   # offsets 0-4 three hours old, 5-9 a minute old
            p.send(t, value=b"v%d" % i, timestamp=now - (3 * HOUR if i < 5 else 60_000))
        p.flush()
    assert len(oncelog("consume", t, "-p", "0", "-n", "2", "-g", g, bootstrap=b).out.splitlines()) == 2

    def seek(*how: str) -> int:
        [row] = oncelog("group", "seek", g, *how, "--format", "json", bootstrap=b).json()
        return row["new_offset"]
    assert seek("--shift-by", "3") == 5
    assert seek("--shift-by", "-10") == 0       # kept within the log
    assert seek("--shift-by", "100") == 10
    assert seek("--by-duration", "PT1H") == 5
    assert seek("--by-duration", "P1D") == 0
    assert seek("--to-datetime", _iso(now - 2 * HOUR)) == 5
    assert seek("--to", "-4h") == 0
    assert seek("--to", "@" + str(now)) == 10   # nothing that recent: the end
    committed = oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()["partitions"]
    assert committed[0]["committed_offset"] == 10

    for bad in (("--shift-by", "1", "--to", "start"), ("--by-duration", "soon"), ("--to-datetime", "-1h"), ()):
        r = oncelog("group", "seek", g, *bad, bootstrap=b)
        assert r.code == 2, (bad, r.err)
        r.one_line_error()


def test_describe_several_groups_and_delete_offsets(shared_broker, unique_topic):
    b, t, g = shared_broker.bootstrap, unique_topic, f"{unique_topic}-g"
    assert oncelog("produce", t, stdin="".join(f"v{i}\n" for i in range(10)), bootstrap=b).code == 0
    assert oncelog("group", "seek", g, "--to", "end", "--topic", t, bootstrap=b).code == 0
    other = f"{g}-other"
    oncelog("consume", t, "-p", "0", "-n", "1", "-g", other, bootstrap=b)
    both = oncelog("group", "describe", g, other, "--format", "json", bootstrap=b).json()
    assert [d["group"] for d in both] == [g, other]
    assert [d["partitions"][0]["committed_offset"] for d in both] == [10, 1]
    everything = oncelog("group", "describe", "--all-groups", "--format", "json", bootstrap=b).json()
    assert {g, other} <= {d["group"] for d in everything}
    assert oncelog("group", "describe", bootstrap=b).code == 2

    # delete-offsets: the group's offsets of the topic are gone
    gone = oncelog("group", "delete-offsets", g, "--topic", t, "--format", "json", bootstrap=b).json()
    assert gone == [{"topic": t, "partition": 0}]
    assert oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()["partitions"] == []
    r = oncelog("group", "delete-offsets", g, "--topic", "no-such-topic-here", bootstrap=b)
    assert r.code == 1, r.err


def test_topic_delete_records_and_trim_prefix(shared_broker, unique_topic):
    b, t = shared_broker.bootstrap, unique_topic
    assert oncelog("topic", "create", t, "-p", "2", bootstrap=b).code == 0
    for p in (0, 1):
        assert oncelog("produce", t, "-p", str(p), stdin="a\nb\nc\nd\ne\n", bootstrap=b).code == 0
    r = oncelog("topic", "delete-records", t, "-o", "3", "-p", "0", "--format", "json", bootstrap=b)
    assert r.json() == [{"topic": t, "partition": 0, "log_start_offset": 3}]
    assert oncelog("consume", t, "-p", "0", "-e", bootstrap=b).out == "d\ne\n"
    r = oncelog("topic", "trim-prefix", t, "-o", "end", "--format", "json", bootstrap=b)
    assert r.json() == [{"topic": t, "partition": 0, "log_start_offset": 5},
                        {"topic": t, "partition": 1, "log_start_offset": 5}]
    starts = [p["log_start_offset"] for p in
              oncelog("topic", "describe", t, "--format", "json", bootstrap=b).json()["partitions"]]
    assert starts == [5, 5]
    assert oncelog("topic", "delete-records", t, "-o", "99", bootstrap=b).code == 1   # beyond the end
    assert oncelog("topic", "delete-records", t, "-o", "soon", bootstrap=b).code == 2
    assert oncelog("topic", "delete-records", t, "-o", "1", "-p", "7", bootstrap=b).code == 2


def test_pid_blocks_as_json(shared_broker, unique_topic):
    with Producer({"bootstrap.servers": shared_broker.bootstrap, "enable.idempotence": True}) as p:
        p.send(unique_topic, value=b"x").result(30)   # an idempotent producer: the broker has a block
    blocks = oncelog("admin", "pid-blocks", "--data-dir", str(shared_broker.data_dir), "--format", "json").json()
    assert blocks and all(set(b) == {"record_offset", "broker_id", "broker_epoch", "first_id", "last_id"}
                          for b in blocks)
    real = [b for b in blocks if b["broker_id"] is not None]
    assert real and all(b["last_id"] >= b["first_id"] >= 0 for b in real)


def test_shell_completion_script_as_documented():
    r = oncelog(env={"_ONCELOG_COMPLETE": "bash_source"})
    assert r.code == 0 and "_ONCELOG_COMPLETE=bash_complete" in r.out, r.err


def test_log_dirs_with_partition_sizes_and_free_space(shared_broker, unique_topic):
    b, t = shared_broker.bootstrap, unique_topic
    assert oncelog("topic", "create", t, "-p", "2", bootstrap=b).code == 0
    assert oncelog("produce", t, "-p", "1", stdin="".join(f"record {i}\n" for i in range(50)), bootstrap=b).code == 0
    [d] = oncelog("cluster", "log-dirs", "--topic", t, "--format", "json", bootstrap=b).json()
    assert d["log_dir"] == os.path.abspath(shared_broker.data_dir) and d["error"] is None
    assert d["total_bytes"] >= d["usable_bytes"] > 0
    sizes = {p["partition"]: p["size_bytes"] for p in d["partitions"] if p["topic"] == t}
    assert set(sizes) == {0, 1} and sizes[0] == 0 and sizes[1] > 50 * 8
    everything = oncelog("cluster", "log-dirs", "--format", "json", bootstrap=b).json()
    assert any(p["topic"] == t for x in everything for p in x["partitions"])
    assert oncelog("cluster", "log-dirs", "--topic", "no-such-topic-here", bootstrap=b).code == 1


def test_quotas_set_described_and_removed(shared_broker):
    b, name = shared_broker.bootstrap, f"quota-client-{time.time_ns()}"
    entity = ("--name", f"client-id={name}")
    assert oncelog("quota", "alter", *entity, "--add", "producer_byte_rate=100000", bootstrap=b).code == 0
    found = oncelog("quota", "describe", *entity, "--format", "json", bootstrap=b).json()
    assert found == [{"entity": {"client-id": name}, "values": {"producer_byte_rate": 100000.0}}]
    assert name in oncelog("quota", "describe", bootstrap=b).out
    assert oncelog("quota", "alter", *entity, "--delete", "producer_byte_rate", bootstrap=b).code == 0
    assert all(not q["values"] for q in oncelog("quota", "describe", *entity, "--format", "json", bootstrap=b).json())
    refused = oncelog("quota", "alter", *entity, "--add", "consumer_byte_rate=2.5", bootstrap=b)
    assert refused.code == 1 and "INVALID_REQUEST" in refused.one_line_error()   # a byte rate is whole
    assert oncelog("quota", "alter", "--name", "team=x", "--add", "producer_byte_rate=1", bootstrap=b).code == 2
