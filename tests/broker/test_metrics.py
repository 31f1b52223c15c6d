"""The /metrics endpoint of a real broker: every error answer counted (the ones handlers did not
count before: MESSAGE_TOO_LARGE in Produce, CreateTopics' and DescribeConfigs' errors), consumer
groups' committed offsets and lag per partition, connections per listener, transactions per
state."""
from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oncelog.client import AdminClient, Producer
from oncelog.client.aio.admin import AIOAdminClient
from oncelog.client.aio.connection import Connection
from oncelog.client.errors import KafkaClientError
from oncelog.client.types import TopicPartition
from oncelog.testing.embedded import BrokerProcess, free_port

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("metrics") / "data",
                      {"metrics.port": str(port), "transaction.two.phase.commit.enable": "true"}).start()
    b.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield b
    b.stop()


def scrape(broker) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value}"""
    text = urllib.request.urlopen(broker.metrics_url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def errors(broker, api: str, error: str) -> float:
    return scrape(broker).get(("oncelog_request_errors_total", (("api", api), ("error", error))), 0)


def eventually(check, timeout_s: float = 20):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_message_too_large_in_produce_is_counted(metered):
    admin = AdminClient({"bootstrap.servers": metered.bootstrap})
    try:
        admin.create_topics(["small-records"], config={"max.message.bytes": "1000"})["small-records"].result()
    finally:
        admin.close()
    before = errors(metered, "Produce", "MESSAGE_TOO_LARGE")
    with Producer({"bootstrap.servers": metered.bootstrap, "retries": "3"}) as p:
        with pytest.raises(KafkaClientError, match="MESSAGE_TOO_LARGE"):
            p.send("small-records", b"x" * 5000).result(30)
    assert errors(metered, "Produce", "MESSAGE_TOO_LARGE") == before + 1


def test_offset_commit_errors_are_counted_per_partition(metered):
    """OffsetCommit counts its partitions' errors as it builds its answer (its answer is not read
    back, issue 36): one per refused partition, none for the partitions taken."""
    from oncelog.protocol import entities
    from oncelog.protocol.api import ApiKey
    from oncelog.testing.raw_client import RawConnection
    admin = AdminClient({"bootstrap.servers": metered.bootstrap})
    try:
        admin.create_topics(["committed"], num_partitions=2)["committed"].result()
    finally:
        admin.close()
    before = errors(metered, "OffsetCommit", "UNKNOWN_TOPIC_OR_PARTITION"), errors(metered, "OffsetCommit", "NONE")
    t = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
    pp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
    with RawConnection(metered.bootstrap) as c:
        r = c.call(ApiKey.OFFSET_COMMIT, 8, group_id="counted", generation_id_or_member_epoch=-1, member_id="",
                   group_instance_id=None, topics=(t(name="committed", partitions=tuple(
                       pp(partition_index=i, committed_offset=1, committed_leader_epoch=-1, committed_metadata="")
                       for i in (0, 1, 5, 6, 7))),))
    assert [int(p.error_code) for p in r.topics[0].partitions] == [0, 0, 3, 3, 3]
    assert errors(metered, "OffsetCommit", "UNKNOWN_TOPIC_OR_PARTITION") == before[0] + 3
    assert errors(metered, "OffsetCommit", "NONE") == before[1] == 0


def test_admin_errors_are_counted_from_the_responses(metered):
    admin = AdminClient({"bootstrap.servers": metered.bootstrap})
    try:
        admin.create_topics(["counted"])["counted"].result()
        before = {e: errors(metered, "CreateTopics", e) for e in ("TOPIC_ALREADY_EXISTS", "INVALID_CONFIG")}
        with pytest.raises(KafkaClientError, match="TOPIC_ALREADY_EXISTS"):
            admin.create_topics(["counted"])["counted"].result()
        with pytest.raises(KafkaClientError, match="INVALID_CONFIG"):
            admin.create_topics(["other"], config={"no.such.config": "1"})["other"].result()
        missing = errors(metered, "DescribeConfigs", "UNKNOWN_TOPIC_OR_PARTITION")
        with pytest.raises(KafkaClientError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            admin.describe_configs("no-such-topic")
    finally:
        admin.close()
    assert errors(metered, "CreateTopics", "TOPIC_ALREADY_EXISTS") == before["TOPIC_ALREADY_EXISTS"] + 1
    assert errors(metered, "CreateTopics", "INVALID_CONFIG") == before["INVALID_CONFIG"] + 1
    assert errors(metered, "DescribeConfigs", "UNKNOWN_TOPIC_OR_PARTITION") == missing + 1


def test_consumer_group_committed_offset_and_lag(metered):
    with Producer({"bootstrap.servers": metered.bootstrap}) as p:
        for i in range(10):
            p.send("lagging", b"%d" % i, partition=0)
        p.flush(30)

    async def commit():
        async with AIOAdminClient({"bootstrap.servers": metered.bootstrap}) as admin:
            await admin.alter_group_offsets("slow-readers", {TopicPartition("lagging", 0): 4})
    asyncio.run(commit())
    labels = (("group", "slow-readers"), ("partition", "0"), ("topic", "lagging"))
    # a scrape shows the groups the coordinator holds (the broker's tick loads an offset-only
    # group, within a second): polled
    m = eventually(lambda: (m := scrape(metered)).get(("oncelog_consumer_group_committed_offset", labels)) == 4
                   and m)
    assert m[("oncelog_consumer_group_lag", labels)] == 6


def test_a_consumer_group_is_counted_and_its_lag_shown(metered):
    """A KIP-848 group (oncelog's consumer with group.protocol=consumer): counted per type and
    state, and its commits' lag as any group's."""
    from oncelog.client import Consumer
    with Producer({"bootstrap.servers": metered.bootstrap}) as p:
        for i in range(8):
            p.send("read-by-a-group", b"%d" % i, partition=0)
        p.flush(30)
    c = Consumer({"bootstrap.servers": metered.bootstrap, "group.id": "kip848-readers", "group.protocol": "consumer",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.subscribe(["read-by-a-group"])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            got += c.poll(0.2, max_records=3 - len(got))
        c.commit(offsets=[TopicPartition("read-by-a-group", 0, 3)], asynchronous=False)
        labels = (("group", "kip848-readers"), ("partition", "0"), ("topic", "read-by-a-group"))
        m = eventually(lambda: (m := scrape(metered)).get(("oncelog_consumer_group_committed_offset", labels)) == 3
                       and m)
        assert m[("oncelog_groups", (("state", "Stable"), ("type", "consumer")))] >= 1
        assert (m[("oncelog_consumer_group_committed_offset", labels)], m[("oncelog_consumer_group_lag", labels)]) \
            == (3, 5)
    finally:
        c.close()


def test_connections_per_listener(metered):
    def count() -> float:
        return scrape(metered)[("oncelog_connections", (("listener", "PLAINTEXT"),))]
    idle = count()

    async def hold(n: int) -> list[Connection]:
        host, port = metered.bootstrap.split(":")
        conns = [Connection(host, int(port), "counted") for _ in range(n)]
        for c in conns:
            await c.connect(10)
        return conns

    async def scenario():
        conns = await hold(3)
        assert await asyncio.to_thread(count) == idle + 3
        for c in conns:
            c.close()
    asyncio.run(scenario())
    eventually(lambda: count() == idle)


def test_transactions_per_state(metered):
    with Producer({"bootstrap.servers": metered.bootstrap, "transactional.id": "metered-tx"}) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("txn-metered", b"one")
        p.commit_transaction()
    assert eventually(lambda: scrape(metered).get(("oncelog_transactions", (("state", "CompleteCommit"),)), 0)) >= 1


def test_the_oldest_open_two_phase_transaction_has_an_age(metered):
    """KIP-939: a prepared transaction nobody completes is visible to operators by its age."""
    key = ("oncelog_transaction_oldest_open_age_seconds", (("two_phase", "true"),))
    p = Producer({"bootstrap.servers": metered.bootstrap, "transactional.id": "metered-2pc",
                  "transaction.two.phase.commit.enable": "true"})
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("txn-metered", b"prepared")
        state = p.prepare_transaction()
        assert eventually(lambda: scrape(metered).get(key, 0) >= 0.5)
        assert p.complete_transaction(state) is True
        assert eventually(lambda: scrape(metered).get(key, -1) == 0)
    finally:
        p.close()


def test_every_metric_served_is_in_the_operations_table(metered):
    """docs/operations.md maps each metric to Kafka's name: none is served without a row."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    text = urllib.request.urlopen(metered.metrics_url, timeout=10).read().decode()
    served = {f.name for f in text_string_to_metric_families(text)
              if f.name.startswith("oncelog_") and not f.name.endswith("_created")}   # prometheus_client's own
    assert "oncelog_producer_state_producers" in served   # the module's producers made some
    missing = []
    for name in served:
        short = name.removeprefix("oncelog_producer_state")
        if not any(f"`{n}" in doc for n in (name, f"{name}_total", short, f"{short}_total")):
            missing.append(name)
    assert missing == []


def test_per_topic_traffic_process_gauges_kafka_api_names_and_no_created_series(metered):
    """Issue 39, item 9: records and bytes in and out per topic (Kafka's BrokerTopicMetrics,
    Redpanda's records produced / fetched), the process collector's gauges, `api` labels as
    Kafka names its requests, and none of prometheus_client's `_created` series."""
    from oncelog.client import Consumer
    admin = AdminClient({"bootstrap.servers": metered.bootstrap})
    try:
        admin.create_topics(["traffic"], num_partitions=2)["traffic"].result()
    finally:
        admin.close()
    with Producer({"bootstrap.servers": metered.bootstrap}) as p:
        for i in range(30):
            p.send("traffic", b"x" * 100, partition=i % 2)
        p.flush()
    c = Consumer({"bootstrap.servers": metered.bootstrap})
    try:
        c.assign([TopicPartition("traffic", 0, 0), TopicPartition("traffic", 1, 0)])
        got = 0
        deadline = time.monotonic() + 30
        while got < 30 and time.monotonic() < deadline:
            got += len(c.poll(0.5))
        assert got == 30
    finally:
        c.close()
    topic = (("topic", "traffic"),)
    values = eventually(lambda: (s := scrape(metered)).get(("oncelog_topic_messages_out_total", topic), 0) >= 30
                        and s)
    assert values[("oncelog_topic_messages_in_total", topic)] == 30
    assert values[("oncelog_topic_bytes_in_total", topic)] >= 30 * 100
    assert values[("oncelog_topic_bytes_out_total", topic)] >= 30 * 100
    apis = {dict(labels).get("api") for (name, labels) in values if name == "oncelog_requests_total"}
    assert {"Produce", "Fetch", "Metadata", "ApiVersions"} <= apis and "produce" not in apis
    assert values[("process_resident_memory_bytes", ())] > 0
    assert ("process_cpu_seconds_total", ()) in values
    assert [name for name, _labels in values if name.endswith("_created")] == []


def test_request_counters_and_the_latency_histogram_as_prometheus_reads_them():
    """The per-API and per-topic counters are plain numbers the loop adds to (issue 38); what a
    scrape renders from them is Prometheus's: a request's latency in the first bucket whose bound
    is at least it (a bound itself included), cumulative buckets, +Inf equal to the count, which
    equals the requests counter; topics summed without resource labels."""
    from prometheus_client import generate_latest

    from oncelog.broker.metrics import BrokerMetrics

    def samples(m: BrokerMetrics) -> dict[tuple[str, tuple], float]:
        text = generate_latest(m.registry).decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    m = BrokerMetrics(lambda: [])
    for seconds in (0.0005, 0.0007, 0.02, 100.0):
        m.observe(0, 1000, 50, seconds)
    m.produced("a", 100, 4)
    m.produced("b", 10, 1)
    m.fetched("a", 30, 2)
    got = samples(m)
    produce = (("api", "Produce"),)
    bucket = "oncelog_request_latency_seconds_bucket"
    assert got[(bucket, (("api", "Produce"), ("le", "0.0005")))] == 1
    assert got[(bucket, (("api", "Produce"), ("le", "0.001")))] == 2
    assert got[(bucket, (("api", "Produce"), ("le", "0.025")))] == 3
    assert got[(bucket, (("api", "Produce"), ("le", "30.0")))] == 3
    assert got[(bucket, (("api", "Produce"), ("le", "+Inf")))] == 4
    assert got[("oncelog_request_latency_seconds_count", produce)] == 4
    assert got[("oncelog_request_latency_seconds_sum", produce)] == pytest.approx(100.0212)
    assert got[("oncelog_requests_total", produce)] == 4
    assert got[("oncelog_request_bytes_total", produce)] == 4000
    assert got[("oncelog_response_bytes_total", produce)] == 200
    assert got[("oncelog_topic_bytes_in_total", (("topic", "a"),))] == 100
    assert got[("oncelog_topic_messages_in_total", (("topic", "b"),))] == 1
    assert got[("oncelog_topic_messages_out_total", (("topic", "a"),))] == 2

    summed = BrokerMetrics(lambda: [], resource_labels=False)
    summed.produced("a", 100, 4)
    summed.produced("b", 10, 1)
    assert samples(summed)[("oncelog_topic_bytes_in_total", ())] == 110
