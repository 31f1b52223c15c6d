"""The operator's commands against a real broker over PLAINTEXT, run as a user runs them (a
subprocess each): topics, produce and consume, groups with their lag, transactions (including a
hanging one aborted by partition and start offset), the cluster, and what bad input gets (one
line on stderr, an exit code a script can use, nothing changed)."""
from __future__ import annotations

import asyncio
import time

import pytest
from oncelog_cli import oncelog

from oncelog.client import Consumer, Producer
from oncelog.client.aio.connection import Connection
from oncelog.client.types import TopicPartition
from oncelog.protocol import produce as produce_wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage import cluster_credential
from oncelog.testing.embedded import BrokerProcess, free_port

pytestmark = pytest.mark.processes


def test_topic_create_list_describe_grow_configure_delete(shared_broker, unique_topic):
    b, t = shared_broker.bootstrap, unique_topic
    r = oncelog("topic", "create", t, "-p", "3", "-c", "cleanup.policy=compact", "-c", "retention.ms=3600000",
                bootstrap=b)
    assert r.code == 0, r.err
    listed = {x["name"]: x for x in oncelog("topic", "list", "--format", "json", bootstrap=b).json()}
    assert listed[t] == {"name": t, "partitions": 3, "internal": False}

    d = oncelog("topic", "describe", t, "--format", "json", bootstrap=b).json()
    assert d["name"] == t
    assert d["configs"] == {"cleanup.policy": "compact", "retention.ms": "3600000"}
    assert [p["partition"] for p in d["partitions"]] == [0, 1, 2]
    for p in d["partitions"]:
        assert p == {"partition": p["partition"], "leader": 1, "log_start_offset": 0, "log_end_offset": 0}

    assert oncelog("topic", "add-partitions", t, "--to", "5", bootstrap=b).code == 0
    assert oncelog("topic", "alter-config", t, "--set", "retention.ms=7200000", "--delete", "cleanup.policy",
                   bootstrap=b).code == 0
    d = oncelog("topic", "describe", t, "--format", "json", bootstrap=b).json()
    assert len(d["partitions"]) == 5
    assert d["configs"] == {"retention.ms": "7200000"}
    everything = oncelog("topic", "describe", t, "--all-configs", "--format", "json", bootstrap=b).json()["configs"]
    assert everything["cleanup.policy"] == "delete" and everything["retention.ms"] == "7200000"

    assert oncelog("topic", "delete", t, bootstrap=b).code == 0
    assert t not in {x["name"] for x in oncelog("topic", "list", "--format", "json", bootstrap=b).json()}
    gone = oncelog("topic", "describe", t, bootstrap=b)
    assert gone.code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in gone.one_line_error()


def test_internal_topics_are_marked(shared_broker, unique_topic):
    b = shared_broker.bootstrap
    r = oncelog("produce", unique_topic, "--transactional-id", f"{unique_topic}-tx", stdin="x\n", bootstrap=b)
    assert r.code == 0, r.err   # the transaction coordinator's topic exists from here on
    listed = {x["name"]: x for x in oncelog("topic", "list", "--format", "json", bootstrap=b).json()}
    assert listed["__transaction_state"]["internal"] is True
    assert listed[unique_topic] == {"name": unique_topic, "partitions": 1, "internal": False}
    plain = {x["name"] for x in oncelog("topic", "list", "--no-internal", "--format", "json", bootstrap=b).json()}
    assert "__transaction_state" not in plain and unique_topic in plain


def test_produce_lines_and_consume_them_in_every_format(shared_broker, unique_topic):
    b, t = shared_broker.bootstrap, unique_topic
    assert oncelog("topic", "create", t, bootstrap=b).code == 0
    before = int(time.time() * 1000)
    r = oncelog("produce", t, "-k", ":", "-H", "origin=cli", "--format", "json",
                stdin="k0:v0\nk1:v1\nk2:v2\nk3:v3\nk4:v4\n", bootstrap=b)
    acks = r.json_lines()
    assert [(a["topic"], a["partition"], a["offset"]) for a in acks] == [(t, 0, i) for i in range(5)]

    records = oncelog("consume", t, "-e", "--format", "json", bootstrap=b).json_lines()
    assert len(records) == 5
    for i, rec in enumerate(records):
        assert rec["topic"] == t and rec["partition"] == 0 and rec["offset"] == i
        assert rec["key"] == f"k{i}" and rec["value"] == f"v{i}"
        assert rec["headers"] == [["origin", "cli"]]
        assert rec["timestamp"] >= before
    assert oncelog("consume", t, "-e", bootstrap=b).out == "".join(f"v{i}\n" for i in range(5))
    assert oncelog("consume", t, "-n", "2", "-o", "3", "--format", "%p/%o %k=%v\\n", bootstrap=b).out == \
        "0/3 k3=v3\n0/4 k4=v4\n"
    assert oncelog("consume", t, "-e", "-n", "0", bootstrap=b).out.count("\n") == 5   # 0: no limit, as rpk
    assert oncelog("consume", t, "-e", "-o", "end", bootstrap=b).out == ""
    assert oncelog("consume", t, "-e", "-o", f"@{before}", "--format", "%o\\n", bootstrap=b).out == \
        "0\n1\n2\n3\n4\n"
    assert oncelog("consume", t, "-e", "-o", f"@{int(time.time() * 1000) + 60_000}", bootstrap=b).out == ""


def test_bytes_that_are_not_text_come_out_as_base64_in_json(shared_broker, unique_topic):
    b, t = shared_broker.bootstrap, unique_topic
    oncelog("produce", t, stdin=b"\xff\xfe\n", bootstrap=b)
    rec, = oncelog("consume", t, "-e", "--format", "json", bootstrap=b).json_lines()
    assert rec["value"] == {"base64": "//4="} and rec["key"] is None


def test_a_group_shows_its_lag_and_none_after_seek_to_end(shared_broker, unique_topic):
    b, t, g = shared_broker.bootstrap, unique_topic, f"{unique_topic}-group"
    oncelog("topic", "create", t, "-p", "2", bootstrap=b)
    assert oncelog("produce", t, "-p", "0", stdin="".join(f"v{i}\n" for i in range(6)), bootstrap=b).code == 0
    assert oncelog("produce", t, "-p", "1", stdin="".join(f"w{i}\n" for i in range(4)), bootstrap=b).code == 0
    ends = {p["partition"]: p["log_end_offset"]
            for p in oncelog("topic", "describe", t, "--format", "json", bootstrap=b).json()["partitions"]}
    assert ends == {0: 6, 1: 4}

    # the group consumes part of partition 0 only
    assert len(oncelog("consume", t, "-p", "0", "-n", "2", "-g", g, bootstrap=b).out.splitlines()) == 2
    d = oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()
    assert d["group"] == g and d["state"] == "Empty" and d["members"] == [] and d["protocol"] == ""
    assert d["partitions"] == [{"topic": t, "partition": 0, "committed_offset": 2, "log_end_offset": ends[0],
                                "lag": ends[0] - 2, "member_id": None}]
    assert g in {x["group"] for x in oncelog("group", "list", "--format", "json", bootstrap=b).json()}

    # a dry run changes nothing; seek --to end makes the lag 0 on every partition of the topic
    oncelog("group", "seek", g, "--to", "end", "--topic", t, "--dry-run", bootstrap=b)
    assert oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()["partitions"][0]["lag"] > 0
    moved = oncelog("group", "seek", g, "--to", "end", "--topic", t, "--format", "json", bootstrap=b).json()
    assert moved == [{"topic": t, "partition": 0, "previous_offset": 2, "new_offset": ends[0]},
                     {"topic": t, "partition": 1, "previous_offset": None, "new_offset": ends[1]}]
    d = oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()
    assert [(p["partition"], p["committed_offset"], p["lag"]) for p in d["partitions"]] == \
        [(0, ends[0], 0), (1, ends[1], 0)]

    # back to the start: everything is lag again, and a consumer of the group reads it all
    oncelog("group", "seek", g, "--to", "start", bootstrap=b)
    d = oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()
    assert sum(p["lag"] for p in d["partitions"]) == 10
    assert len(oncelog("consume", t, "-e", "-g", g, bootstrap=b).out.splitlines()) == 10
    assert sum(p["lag"] for p in oncelog("group", "describe", g, "--format", "json",
                                         bootstrap=b).json()["partitions"]) == 0

    assert oncelog("group", "delete", g, bootstrap=b).code == 0
    assert oncelog("group", "describe", g, bootstrap=b).one_line_error() == f"oncelog: group {g} does not exist"


def test_a_consumer_group_is_described_with_its_epochs(shared_broker, unique_topic):
    """A KIP-848 group (oncelog's consumer with group.protocol=consumer): `group list` says its
    type, `group describe` its epochs and each member's epoch, assignment and target."""
    b, t, g = shared_broker.bootstrap, unique_topic, f"{unique_topic}-group"
    oncelog("topic", "create", t, "-p", "3", bootstrap=b)
    c = Consumer({"auto.offset.reset": "earliest",
                  "bootstrap.servers": b, "group.id": g, "group.protocol": "consumer", "client.id": "cli-test"})
    c.subscribe([t])
    deadline = time.monotonic() + 30
    while len(c.assignment()) < 3 and time.monotonic() < deadline:
        c.poll(0.1)
    try:
        d = oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()
        assert (d["type"], d["state"], d["protocol"]) == ("consumer", "Stable", "uniform")
        [m] = d["members"]
        assert m["member_epoch"] == d["group_epoch"] == d["assignment_epoch"] >= 1
        assert m["client_id"] == "cli-test"
        assert m["assignment"] == m["target_assignment"] == [{"topic": t, "partition": p} for p in range(3)]
        text = oncelog("group", "describe", g, bootstrap=b).out
        assert f"consumer group at epoch {d['group_epoch']}" in text and f"{t}:0,1,2" in text
        listed = {x["group"]: x for x in oncelog("group", "list", "--format", "json", bootstrap=b).json()}
        assert (listed[g]["type"], listed[g]["state"]) == ("consumer", "Stable")
    finally:
        c.close()
    assert oncelog("group", "describe", g, "--format", "json", bootstrap=b).json()["state"] == "Empty"


def test_produce_in_a_transaction_and_read_committed(shared_broker, unique_topic):
    b, t, tid = shared_broker.bootstrap, unique_topic, f"{unique_topic}-tx"
    r = oncelog("produce", t, "--transactional-id", tid, stdin="a\nb\nc\n", bootstrap=b)
    assert r.code == 0, r.err
    assert oncelog("consume", t, "-e", "--isolation", "read_committed", bootstrap=b).out == "a\nb\nc\n"
    listed = {x["transactional_id"]: x for x in oncelog("transactions", "list", "--format", "json",
                                                         bootstrap=b).json()}
    assert listed[tid]["state"] == "CompleteCommit" and listed[tid]["producer_id"] >= 0
    d = oncelog("transactions", "describe", tid, "--format", "json", bootstrap=b).json()
    assert d["transactional_id"] == tid and d["state"] == "CompleteCommit"
    assert d["producer_id"] == listed[tid]["producer_id"] and d["producer_epoch"] >= 0
    assert d["timeout_ms"] > 0 and d["partitions"] == []
    unknown = oncelog("transactions", "describe", f"{tid}-unknown", bootstrap=b)
    assert unknown.code == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in unknown.one_line_error()


def test_abort_by_transactional_id_fences_the_producer(shared_broker, unique_topic):
    b, t, tid = shared_broker.bootstrap, unique_topic, f"{unique_topic}-tx"
    p = Producer({"bootstrap.servers": b, "transactional.id": tid})
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(t, b"never committed").result(30)
        d = oncelog("transactions", "describe", tid, "--format", "json", bootstrap=b).json()
        assert d["state"] == "Ongoing" and d["partitions"] == [{"topic": t, "partition": 0}] and d["start_ms"] > 0
        assert oncelog("consume", t, "-e", "--isolation", "read_committed", bootstrap=b).out == ""

        r = oncelog("transactions", "abort", "--transactional-id", tid, bootstrap=b)
        assert r.code == 0, r.err
        # the coordinator aborted the open transaction and handed the id a new epoch (Kafka's
        # InitProducerId): nothing open any more, and the old producer is fenced
        after = oncelog("transactions", "describe", tid, "--format", "json", bootstrap=b).json()
        assert after["state"] == "Empty" and after["partitions"] == []
        assert after["producer_epoch"] > d["producer_epoch"] or after["producer_id"] != d["producer_id"]
        with pytest.raises(Exception, match="FENCED|fenced|INVALID_PRODUCER_EPOCH"):
            p.commit_transaction(30)
    finally:
        p.close()
    assert oncelog("consume", t, "-e", "--isolation", "read_committed", bootstrap=b).out == ""


async def _open_hanging_transaction(bootstrap: str, topic: str, producer_id: int) -> None:
    """A transactional batch the coordinator never heard of (a broker with
    transaction.partition.verification.enable=false takes it): it hangs until aborted."""
    host, port = bootstrap.split(":")
    conn = Connection(host, int(port), "hanging")
    await conn.connect(10)
    try:
        batch = encode_batch([Record(i, int(time.time() * 1000), None, b"hanging-%d" % i, []) for i in range(2)],
                             producer_id=producer_id, producer_epoch=0, base_sequence=0, transactional=True)
        body = produce_wire.encode_request(9, -1, 30000, {topic: [(0, batch)]}, transactional_id="ghost")
        (answer,) = produce_wire.decode_response(9, await conn.request(ApiKey.PRODUCE, 9, body))
        assert answer.partitions[0].error_code == 0, answer
    finally:
        conn.close()


def _foreign_credential(tmp_path):
    """The cluster user's name with another cluster's password."""
    path = cluster_credential.path_in(tmp_path / "elsewhere")
    path.parent.mkdir()
    cluster_credential.load_or_create(path)
    return path


def test_a_hanging_transaction_is_found_and_aborted_by_partition_and_start_offset(tmp_path, unique_topic):
    t = unique_topic
    with BrokerProcess(tmp_path / "data", {"transaction.partition.verification.enable": "false"}) as broker:
        b = broker.bootstrap
        oncelog("topic", "create", t, bootstrap=b)
        asyncio.run(_open_hanging_transaction(b, t, 777_000))
        oncelog("produce", t, stdin="after\n", bootstrap=b)
        assert oncelog("consume", t, "-e", "--isolation", "read_committed", bootstrap=b).out == ""  # LSO is 0

        producers = oncelog("transactions", "describe-producers", "--topic", t, "--partition", "0", "--format",
                            "json", bootstrap=b).json()
        hanging = [p for p in producers if p["producer_id"] == 777_000]
        assert hanging == [{"producer_id": 777_000, "producer_epoch": 0, "last_sequence": 1,
                            "last_timestamp": hanging[0]["last_timestamp"], "coordinator_epoch": -1,
                            "current_txn_start_offset": 0}]
        # find-hanging names it (kafka-transactions.sh find-hanging); a transaction its coordinator
        # tracks is not hanging, however long it is open
        tracked = Producer({"bootstrap.servers": b, "transactional.id": f"{t}-tracked"})
        tracked.init_transactions(30)
        tracked.begin_transaction()
        tracked.send(t, value=b"open").result(30)
        found = oncelog("transactions", "find-hanging", "--topic", t, "--max-transaction-timeout", "0",
                        "--format", "json", bootstrap=b).json()
        assert [(h["producer_id"], h["start_offset"]) for h in found] == [(777_000, 0)]
        assert oncelog("transactions", "find-hanging", "--topic", t, "--format", "json", bootstrap=b).json() == []
        assert oncelog("transactions", "find-hanging", bootstrap=b).code == 2
        tracked.abort_transaction(30)
        tracked.close()

        # only a broker writes markers: without the cluster credential, the same abort is refused
        hanging_abort = ("transactions", "abort", "--topic", t, "--partition", "0", "--start-offset")
        credential = ("--credential-file", str(tmp_path / "data" / "cluster.credential"))
        wrong = oncelog(*hanging_abort, "1", *credential, bootstrap=b)
        assert wrong.code == 1 and "no open transaction" in wrong.one_line_error()
        refused = oncelog(*hanging_abort, "0", "--credential-file", str(_foreign_credential(tmp_path)), bootstrap=b)
        assert refused.code != 0 and "authentication failed" in refused.one_line_error().lower(), refused.err
        r = oncelog(*hanging_abort, "0", *credential, bootstrap=b)
        assert r.code == 0, r.err
        assert oncelog("consume", t, "-e", "--isolation", "read_committed", bootstrap=b).out == "after\n"
        assert oncelog("transactions", "find-hanging", "--broker-id", "1", "--max-transaction-timeout", "0",
                       "--format", "json", bootstrap=b).json() == []
        after = oncelog("transactions", "describe-producers", "--topic", t, "--partition", "0", "--format", "json",
                        bootstrap=b).json()
        assert all(p["current_txn_start_offset"] == -1 for p in after)


def test_cluster_info_and_broker_settings(shared_broker):
    b = shared_broker.bootstrap
    host, port = b.split(":")
    info = oncelog("cluster", "info", "--format", "json", bootstrap=b).json()
    assert info["controller_id"] == 1 and len(info["cluster_id"]) == 22
    assert info["brokers"] == [{"node_id": 1, "host": host, "port": int(port), "rack": None}]
    got = oncelog("cluster", "config", "get", "log.producer.state.batches.to.retain", "--format", "json",
                  bootstrap=b).json()
    assert got == {"log.producer.state.batches.to.retain": "5"}
    assert oncelog("cluster", "config", "set", "log.producer.state.batches.to.retain=7", bootstrap=b).code == 0
    try:
        assert oncelog("cluster", "config", "get", "log.producer.state.batches.to.retain", "--format", "json",
                       bootstrap=b).json() == {"log.producer.state.batches.to.retain": "7"}
    finally:
        oncelog("cluster", "config", "set", "--delete", "log.producer.state.batches.to.retain", bootstrap=b)
    assert oncelog("cluster", "config", "get", "log.producer.state.batches.to.retain", "--format", "json",
                   bootstrap=b).json() == {"log.producer.state.batches.to.retain": "5"}


def test_the_bootstrap_server_comes_from_the_environment(shared_broker):
    r = oncelog("cluster", "info", "--format", "json", env={"ONCELOG_BOOTSTRAP_SERVER": shared_broker.bootstrap})
    assert r.json()["controller_id"] == 1


# ------------------------------------------------------------------ bad input

def test_a_broker_that_is_down_is_one_line_naming_it():
    address = f"127.0.0.1:{free_port()}"
    for args in (("topic", "list"), ("group", "describe", "g"), ("consume", "t", "-e"), ("cluster", "info")):
        r = oncelog(*args, bootstrap=address)
        assert r.code == 3
        assert r.one_line_error().startswith(f"oncelog: cannot reach {address}: connection refused")
    r = oncelog("produce", "t", stdin="x\n", bootstrap=address)
    assert r.code == 3 and f"cannot reach {address}" in r.one_line_error()


def test_bad_input_is_one_line_and_changes_nothing(shared_broker, unique_topic, tmp_path):
    b, t = shared_broker.bootstrap, unique_topic
    cases = [
        (("topic", "create", t, "-c", "retention.ms"), 2, "expected NAME=VALUE"),
        (("topic", "create", t, "-c", "no.such.config=1"), 1, "INVALID_CONFIG"),
        (("topic", "create", t, "-p", "0"), 2, "--partitions"),
        (("topic", "alter-config", t, "--set", "retention.ms=1"), 1, "UNKNOWN_TOPIC_OR_PARTITION"),
        (("consume", t, "-e"), 1, "UNKNOWN_TOPIC_OR_PARTITION"),
        (("consume", "-o", "middle", t), 2, "-o 'middle'"),
        (("group", "describe", f"{t}-nobody"), 1, "does not exist"),
        (("group", "seek", f"{t}-nobody", "--to", "sideways"), 2, "--to 'sideways'"),
        (("acl", "create", "--allow-principal", "User:alice", "--operation", "read", "--resource-type", "galaxy",
          "--resource-name", "x"), 2, "unknown resource type 'galaxy'"),
        (("acl", "create", "--allow-principal", "User:alice", "--operation", "juggle", "--topic", t), 2,
         "unknown operation 'juggle'"),
        (("topic", "list", "--no-such-option"), 2, "--no-such-option"),
        (("topic", "list", "--command-config", str(tmp_path / "missing.properties")), 2, "missing.properties"),
    ]
    for args, code, text in cases:
        r = oncelog(*args, bootstrap=b)
        line = r.one_line_error()
        assert r.code == code and text in line, (args, r.code, line)
    assert t not in {x["name"] for x in oncelog("topic", "list", "--format", "json", bootstrap=b).json()}
    r = oncelog("produce", t, "-k", ":", stdin="no separator\n", bootstrap=b)
    assert r.code == 2 and "line 1 has no key separator" in r.one_line_error()


# ------------------------------------------------------------------ log dump

def test_log_dump_shows_batches_and_verify_finds_a_flipped_byte(tmp_path, unique_topic):
    t = unique_topic
    with BrokerProcess(tmp_path / "data") as broker:
        b = broker.bootstrap
        assert oncelog("produce", t, stdin="one\ntwo\n", bootstrap=b).code == 0
        assert oncelog("produce", t, "--transactional-id", "dump-tx", stdin="three\n", bootstrap=b).code == 0
        c = Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": b, "isolation.level": "read_committed"})
        try:   # the COMMIT marker is written once this reads "three"
            c.assign([TopicPartition(t, 0, 0)])
            deadline, seen = time.monotonic() + 30, []
            while len(seen) < 3:
                assert time.monotonic() < deadline
                seen += c.poll(0.5)
        finally:
            c.close()
    segment = tmp_path / "data" / f"{t}-0" / "00000000000000000000.log"   # the broker is stopped

    r = oncelog("log", "dump", str(segment), "--verify", "--records", "--format", "json")
    (report,) = r.json()
    assert report["problems"] == []
    plain, txn, marker = report["batches"]
    assert (plain["base_offset"], plain["last_offset"], plain["count"]) == (0, 1, 2)
    assert plain["producer_id"] >= 0 and plain["base_sequence"] == 0 and plain["last_sequence"] == 1
    assert not plain["transactional"] and plain["crc_valid"] and plain["magic"] == 2
    assert [x["value"] for x in plain["records"]] == ["one", "two"]
    assert txn["transactional"] and txn["base_offset"] == 2 and txn["producer_id"] != plain["producer_id"]
    assert marker["control"] and marker["marker"] == "COMMIT" and marker["base_offset"] == 3
    assert marker["producer_id"] == txn["producer_id"] and marker["position"] == txn["position"] + txn["size"]
    text = oncelog("log", "dump", str(segment), "--verify")
    assert text.code == 0 and "endTxnMarker: COMMIT" in text.out
    assert "3 batches, verified" in text.out

    # one flipped bit in the second batch's records
    data = bytearray(segment.read_bytes())
    data[txn["position"] + txn["size"] - 3] ^= 0x10
    segment.write_bytes(bytes(data))
    bad = oncelog("log", "dump", str(segment), "--verify")
    assert bad.code == 1 and bad.one_line_error() == "oncelog: 1 problems found"
    assert f"PROBLEM at position {txn['position']}: batch at offset 2: CRC mismatch" in bad.out
    # and a torn tail
    segment.write_bytes(bytes(data) + b"\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00")
    torn = oncelog("log", "dump", str(segment), "--verify")
    assert torn.code == 1 and "10 bytes at the end do not frame a batch" in torn.out


def test_log_dump_of_a_file_that_is_not_a_segment(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("these are not record batches\n" * 10)
    r = oncelog("log", "dump", str(text))
    assert r.code == 1 and r.one_line_error() == f"oncelog: {text} is not a log segment: no record batch at position 0"


def test_a_prepared_2pc_transaction_is_found_by_duration_and_completed_by_hand(shared_broker, unique_topic):
    """KIP-939's operator: `transactions list --duration-filter` finds the prepared transaction a
    vanished manager left open (it holds the topic's last stable offset, however long), and
    `transactions complete` commits it when the state given is its own (abort otherwise)."""
    b, t = shared_broker.bootstrap, unique_topic
    ids = {}
    for name in ("kept", "stale"):
        tid = f"{t}-{name}"
        p = Producer({"bootstrap.servers": b, "transactional.id": tid, "transaction.two.phase.commit.enable": "true"})
        p.init_transactions(30)
        p.begin_transaction()
        p.send(t, name.encode(), partition=0)
        ids[tid] = str(p.prepare_transaction(30))
        p.close(5)   # the manager is gone: the transaction stays prepared
    time.sleep(0.3)   # so that both have run longer than the filter below
    old = {x["transactional_id"] for x in oncelog("transactions", "list", "--duration-filter", "200",
                                                   "--format", "json", bootstrap=b).json()}
    assert set(ids) <= old
    young = {x["transactional_id"] for x in oncelog("transactions", "list", "--duration-filter", "3600000",
                                                     "--format", "json", bootstrap=b).json()}
    assert not set(ids) & young
    assert oncelog("consume", t, "-e", "--isolation", "read_committed", bootstrap=b).out == ""
    kept, stale = ids
    r = oncelog("transactions", "complete", "--transactional-id", kept, "--prepared-state", ids[kept], bootstrap=b)
    assert r.code == 0 and "committed" in r.out, r.err
    pid, epoch = ids[stale].split(":")
    r = oncelog("transactions", "complete", "--transactional-id", stale, "--prepared-state",
                f"{pid}:{int(epoch) + 3}", bootstrap=b)
    assert r.code == 0 and "aborted" in r.out, r.err
    assert oncelog("consume", t, "-e", "--isolation", "read_committed", bootstrap=b).out == "kept\n"
    bad = oncelog("transactions", "complete", "--transactional-id", kept, "--prepared-state", "nonsense", bootstrap=b)
    assert bad.code != 0
