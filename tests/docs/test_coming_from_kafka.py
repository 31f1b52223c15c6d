"""docs/coming-from-kafka.md stays true: its table of broker defaults names oncelog's real
defaults, and every Kafka setting it leaves out has Kafka's default; every broker setting is
Kafka's or a row of its table of those Kafka does not have; its table of client defaults too, and
every client default it leaves out is the Java client's; its command-line table names commands
that exist and parse, and every command; the Python client's section names methods and fields the
classes have; its Python snippet runs as written against a broker (the list of APIs not served is
tests/docs/test_api_table.py's)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.broker.config import BrokerConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "coming-from-kafka.md"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_broker_defaults_table_is_oncelogs_and_every_other_default_is_kafkas():
    rows = re.findall(r"^\| `([a-z.]+)` \| [^|]+ \| ([^|]+) \|", _section(PAGE.read_text(), "## Broker defaults"),
                      re.M)
    assert len(rows) >= 8
    defaults = BrokerConfig.load(None, {})
    for name, shown in rows:
        value = defaults[name]
        shown = shown.strip()
        if shown.startswith("("):     # "(empty: ...)"
            assert value == "", (name, shown, value)
            continue
        assert shown.strip("`").split(" ")[0].strip("`") == _shown(value), (name, shown, value)
    listed = {name for name, _ in rows}
    for name, kafka in KAFKA_BROKER_DEFAULTS.items():
        if kafka is not None and name not in listed:
            assert _shown(defaults[name]) == kafka, \
                f"{name}: oncelog's default {defaults[name]!r}, Kafka's {kafka!r}: a row of the table"


# Kafka's broker configs (KafkaConfig and the configs it includes, Kafka 4.x) that oncelog takes under
# the same name, with Kafka's default as oncelog writes it. A setting added to oncelog is either one
# of these or a row of the page's table of settings Kafka does not have; a default that differs
# from Kafka's is a row of its table of defaults: the tests fail until it is said.
KAFKA_BROKER_DEFAULTS: dict[str, str | None] = {
    "add.partitions.to.txn.retry.backoff.max.ms": "100", "add.partitions.to.txn.retry.backoff.ms": "20",
    "advertised.listeners": "", "allow.everyone.if.no.acl.found": "false", "authorizer.class.name": "",
    "auto.create.topics.enable": "true", "broker.heartbeat.interval.ms": "2000", "compression.type": "producer",
    "connection.failed.authentication.delay.ms": "100", "connections.max.idle.ms": "600000",
    "connections.max.reauth.ms": "0", "controller.listener.names": "", "controller.quorum.bootstrap.servers": "",
    # KIP-1191's (Kafka 4.4's GroupCoordinatorConfig, dynamic)
    "errors.deadletterqueue.auto.create.topics.enable": "false", "errors.deadletterqueue.topic.name.prefix": "dlq.",
    "default.replication.factor": "1", "fetch.max.bytes": "57671680", "group.consumer.assignors": "uniform,range",
    "group.consumer.heartbeat.interval.ms": "5000", "group.consumer.max.heartbeat.interval.ms": "15000",
    "group.consumer.max.session.timeout.ms": "60000", "group.consumer.max.size": "2147483647",
    "group.consumer.min.heartbeat.interval.ms": "5000", "group.consumer.min.session.timeout.ms": "45000",
    "group.consumer.session.timeout.ms": "45000", "group.coordinator.rebalance.protocols": "classic,consumer",
    "group.initial.rebalance.delay.ms": "3000", "group.max.session.timeout.ms": "1800000",
    "group.min.session.timeout.ms": "6000", "group.share.delivery.count.limit": "5",
    "group.share.heartbeat.interval.ms": "5000", "group.share.max.share.sessions": "2000",
    "group.share.max.size": "200", "group.share.partition.max.record.locks": "2000",
    "group.share.record.lock.duration.ms": "30000", "group.share.session.timeout.ms": "45000",
    "inter.broker.listener.name": "",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
    "listeners": "PLAINTEXT://:9092", "log.cleaner.dedupe.buffer.size": "134217728",
    "log.cleaner.delete.retention.ms": "86400000", "log.cleaner.enable": "true",
    "log.cleaner.max.compaction.lag.ms": "9223372036854775807", "log.cleaner.min.cleanable.ratio": "0.5",
    "log.cleaner.min.compaction.lag.ms": "0", "log.cleanup.policy": "delete", "log.dirs": "/tmp/kraft-combined-logs",
    "log.flush.interval.messages": "9223372036854775807",
    "log.flush.interval.ms": "9223372036854775807",   # null: log.flush.scheduler.interval.ms, Long.MAX_VALUE
    "log.index.interval.bytes": "4096",
    "log.message.format.version": "3.0",              # 3.0-IV1, Kafka 3.x's (gone in 4.0)
    "log.message.timestamp.type": "CreateTime", "log.retention.bytes": "-1",
    "log.retention.check.interval.ms": "300000",
    "log.retention.ms": "604800000",                  # null: log.retention.hours=168
    "log.retention.hours": None, "log.retention.minutes": None, "log.roll.hours": None,   # through the ms names
    "log.roll.ms": "604800000",                       # null: log.roll.hours=168
    "log.segment.bytes": "1073741824", "log.segment.delete.delay.ms": "60000",
    "max.connection.creation.rate": "2147483647", "max.connections": "2147483647",
    "max.connections.per.ip": "2147483647", "max.connections.per.ip.overrides": "", "message.max.bytes": "1048588",
    "node.id": "-1", "num.partitions": "1", "offset.metadata.max.bytes": "4096",
    "offsets.retention.check.interval.ms": "600000", "offsets.retention.minutes": "10080",
    "offsets.topic.num.partitions": "50", "producer.id.expiration.check.interval.ms": "600000",
    "producer.id.expiration.ms": "86400000", "quota.window.num": "11", "quota.window.size.seconds": "1",
    "sasl.enabled.mechanisms": "GSSAPI", "sasl.mechanism.inter.broker.protocol": "GSSAPI",
    "sasl.server.max.receive.size": "524288", "security.inter.broker.protocol": "PLAINTEXT",
    "socket.request.max.bytes": "104857600", "ssl.cipher.suites": "", "ssl.client.auth": "none",
    "ssl.enabled.protocols": "TLSv1.2,TLSv1.3", "ssl.key.password": "", "ssl.keystore.certificate.chain": "",
    "ssl.keystore.key": "", "ssl.keystore.location": "", "ssl.keystore.password": "", "ssl.keystore.type": "JKS",
    "ssl.principal.mapping.rules": "DEFAULT", "ssl.truststore.certificates": "", "ssl.truststore.location": "",
    "ssl.truststore.password": "", "ssl.truststore.type": "JKS", "super.users": "",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000", "transaction.max.timeout.ms": "900000",
    "transaction.partition.verification.enable": "true",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "3600000",
    "transaction.state.log.num.partitions": "50", "transaction.state.log.segment.bytes": "104857600",
    "transaction.two.phase.commit.enable": "false", "transactional.id.expiration.ms": "604800000",
}
KAFKA_BROKER_CONFIGS = frozenset(KAFKA_BROKER_DEFAULTS)


def _shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_every_broker_setting_is_kafkas_or_in_the_table_of_those_kafka_does_not_have():
    from oncelog.broker.config import SETTINGS
    section = _section(PAGE.read_text(), "## Broker settings Kafka does not have")
    rows = re.findall(r"^\| `([a-z.]+)` \| ([^|]+) \| ([^|]+) \|$", section, re.M)
    assert len(rows) >= 12
    assert not {name for name, *_ in rows} & KAFKA_BROKER_CONFIGS
    # a row may name its companions in its last column (`controller.sasl.plain.password`)
    listed = {name for name, *_ in rows} | {
        name for row in rows for name in re.findall(r"`([a-z][a-z.]+)`", row[2])
        if name in SETTINGS and name not in KAFKA_BROKER_CONFIGS}
    unclassified = set(SETTINGS) - KAFKA_BROKER_CONFIGS - listed
    assert not unclassified, f"broker settings neither Kafka's nor in docs/coming-from-kafka.md's table: {unclassified}"
    assert KAFKA_BROKER_CONFIGS <= set(SETTINGS), KAFKA_BROKER_CONFIGS - set(SETTINGS)
    defaults = BrokerConfig.load(None, {})
    for name, shown, _what in rows:
        shown = shown.strip().strip("`")
        value = SETTINGS[name].default if name == "cluster.id" else defaults[name]
        if shown.startswith("("):
            assert value == "", (name, value)
        else:
            assert shown == _shown(value), (name, shown, value)


@pytest.mark.processes
def test_the_asyncio_snippet_runs_as_written(shared_broker):
    code = re.search(r"```python\n(.*?)```", _section(PAGE.read_text(), "## The Python client"), re.S)
    assert code is not None
    source = code.group(1).replace("127.0.0.1:9092", shared_broker.bootstrap)
    r = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"written at offset \d+\nb'hello'\n", r.stdout), r.stdout


# ------------------------------------------------------------------ client defaults

# The Java client's defaults (Kafka 4.x ProducerConfig, ConsumerConfig, AdminClientConfig) of the
# settings oncelog's client takes: "every setting they take has the Java client's default, except
# these", and the table's Java column, are checked against it.
JAVA_DEFAULTS = {
    ("producer", "acks"): "all", ("producer", "batch.size"): "16384", ("producer", "buffer.memory"): "33554432",
    ("producer", "compression.type"): "none", ("producer", "delivery.timeout.ms"): "120000",
    ("producer", "enable.idempotence"): "true", ("producer", "linger.ms"): "5", ("producer", "max.block.ms"): "60000",
    ("producer", "max.in.flight.requests.per.connection"): "5", ("producer", "max.request.size"): "1048576",
    ("producer", "metadata.max.age.ms"): "300000", ("producer", "partitioner.adaptive.partitioning.enable"): "true",
    ("producer", "partitioner.ignore.keys"): "false", ("producer", "retries"): "2147483647",
    ("producer", "retry.backoff.ms"): "100", ("producer", "request.timeout.ms"): "30000",
    ("producer", "transaction.timeout.ms"): "60000", ("producer", "client.id"): "producer-N",
    ("consumer", "auto.offset.reset"): "latest", ("consumer", "check.crcs"): "true",
    ("consumer", "fetch.max.bytes"): "52428800", ("consumer", "fetch.max.wait.ms"): "500",
    ("consumer", "fetch.min.bytes"): "1", ("consumer", "isolation.level"): "read_uncommitted",
    ("consumer", "max.partition.fetch.bytes"): "1048576", ("consumer", "session.timeout.ms"): "45000",
    ("consumer", "heartbeat.interval.ms"): "3000", ("consumer", "max.poll.interval.ms"): "300000",
    ("consumer", "enable.auto.commit"): "true", ("consumer", "auto.commit.interval.ms"): "5000",
    ("consumer", "group.protocol"): "classic",
    ("consumer", "partition.assignment.strategy"): "range, cooperative-sticky",
    ("consumer", "allow.auto.create.topics"): "true", ("consumer", "request.timeout.ms"): "30000",
    ("consumer", "client.id"): "consumer-<group>-N", ("admin", "request.timeout.ms"): "30000",
    ("admin", "client.id"): "adminclient-N",
}


def oncelog_client_defaults() -> dict[tuple[str, str], str]:
    """What oncelog's clients use when a setting is not given, read from the objects they build."""
    from oncelog.client.aio.admin import AIOAdminClient
    from oncelog.client.aio.consumer import AIOConsumer
    from oncelog.client.aio.group import RANGE, GroupConfig
    from oncelog.client.config import ProducerConfig
    from oncelog.protocol.compression import codec_for_name

    given = {"bootstrap.servers": "127.0.0.1:1"}
    p = ProducerConfig.from_dict(given)
    c = AIOConsumer(given)
    g = GroupConfig.from_dict({"group.id": "g"})
    a = AIOAdminClient(given)
    flag = lambda v: str(v).lower()   # noqa: E731
    return {
        ("producer", "acks"): {-1: "all"}.get(p.acks, str(p.acks)), ("producer", "batch.size"): str(p.batch_size),
        ("producer", "buffer.memory"): str(p.buffer_memory),
        ("producer", "compression.type"): "none" if p.compression == codec_for_name("none") else str(p.compression),
        ("producer", "delivery.timeout.ms"): str(p.delivery_timeout_ms),
        ("producer", "enable.idempotence"): p.idempotence.value, ("producer", "linger.ms"): str(p.linger_ms),
        ("producer", "max.block.ms"): str(p.max_block_ms),
        ("producer", "max.in.flight.requests.per.connection"): str(p.max_in_flight),
        ("producer", "max.request.size"): str(p.max_request_size),
        ("producer", "metadata.max.age.ms"): str(p.metadata_max_age_ms),
        ("producer", "partitioner.adaptive.partitioning.enable"): flag(p.partitioner_adaptive),
        ("producer", "partitioner.ignore.keys"): flag(p.partitioner_ignore_keys),
        ("producer", "retries"): str(p.retries),
        ("producer", "retry.backoff.ms"): str(p.retry_backoff_ms),
        ("producer", "request.timeout.ms"): str(p.request_timeout_ms),
        ("producer", "transaction.timeout.ms"): str(p.transaction_timeout_ms), ("producer", "client.id"): p.client_id,
        ("consumer", "auto.offset.reset"): c.reset, ("consumer", "check.crcs"): flag(c.check_crcs),
        ("consumer", "fetch.max.bytes"): str(c.max_bytes), ("consumer", "fetch.max.wait.ms"): str(c.max_wait_ms),
        ("consumer", "fetch.min.bytes"): str(c.min_bytes),
        ("consumer", "isolation.level"): ["read_uncommitted", "read_committed"][c.isolation_level],
        ("consumer", "max.partition.fetch.bytes"): str(c.partition_max_bytes),
        ("consumer", "session.timeout.ms"): str(g.session_timeout_ms),
        ("consumer", "heartbeat.interval.ms"): str(g.heartbeat_interval_ms),
        ("consumer", "max.poll.interval.ms"): str(g.max_poll_interval_ms),
        ("consumer", "enable.auto.commit"): flag(g.auto_commit),
        ("consumer", "auto.commit.interval.ms"): str(g.auto_commit_interval_ms),
        # None: KIP-848's protocol where the coordinator serves it, else classic (client/aio/group.py)
        ("consumer", "group.protocol"): g.protocol or "consumer",
        ("consumer", "partition.assignment.strategy"): RANGE,
        ("consumer", "allow.auto.create.topics"): flag(c.cluster.allow_auto_create),
        ("consumer", "request.timeout.ms"): str(int(c.cluster.timeout_s * 1000)),
        ("consumer", "client.id"): c.cluster.client_id,
        ("admin", "request.timeout.ms"): str(int(a.cluster.timeout_s * 1000)),
        ("admin", "client.id"): a.cluster.client_id,
    }


def test_the_client_defaults_table_is_oncelogs_and_every_other_default_is_javas():
    from oncelog.client import config_keys
    section = _section(PAGE.read_text(), "## Client defaults that differ")
    rows = re.findall(r"^\| `([a-z.]+)`( \((?:producer|consumer)\))? \| ([^|]+) \| [^|]+ \| ([^|]+) \|", section, re.M)
    assert len(rows) >= 6
    ours = oncelog_client_defaults()
    assert {key for _kind, key in ours} <= config_keys.ANY
    listed = set()
    for name, only, java, shown in rows:
        kinds = [only.strip(" ()")] if only else [k for k in ("producer", "consumer", "admin") if (k, name) in ours]
        values = re.findall(r"`([^`]+)`", shown)
        assert values, (name, shown)
        for kind in kinds:
            listed.add((kind, name))
            assert ours[(kind, name)] in values, (kind, name, ours[(kind, name)], shown)
            assert JAVA_DEFAULTS[(kind, name)].split("-")[0] in java, (kind, name, java)
        if name == "client.id":
            assert set(values) == {ours[(k, name)] for k in kinds}
    for key, java in JAVA_DEFAULTS.items():
        if key not in listed:
            assert ours[key] == java, f"{key}: oncelog's default {ours[key]!r}, Java's {java!r}: a row of the table"


# ------------------------------------------------------------------ the command line

def _cli_spans(section: str) -> list[tuple[str, str]]:
    """(Kafka's column, each `oncelog ...` span of the oncelog column) of the table's rows."""
    out = []
    for kafka, ours in re.findall(r"^\| (.+?) \| (.+?) \| .*\|$", section, re.M):
        out += [(kafka, span) for span in re.findall(r"`oncelog ([^`]+)`", ours)]
    return out


def _expand(words: list[str]) -> list[list[str]]:
    """`topic create/list` -> [topic create], [topic list]."""
    if not words:
        return [[]]
    head = words[0].split("/") if "/" in words[0] and not words[0].startswith("-") else [words[0]]
    return [[h, *rest] for h in head for rest in _expand(words[1:])]


def test_the_command_line_table_names_commands_that_parse_and_every_command():
    from docs_cli import ask
    section = _section(PAGE.read_text(), "## The command line")
    spans = _cli_spans(section)
    assert len(spans) >= 15
    argvs = []
    for kafka, span in spans:
        words = span.replace("[", "").replace("]", "").split()
        if words[-1] == "...":   # "(same names)": the tool's subcommands, from Kafka's column
            words = [*words[:-1], re.search(r"\.sh ([\w/-]+)", kafka).group(1)]
        argvs += _expand(words)
    tree, errors = ask(argvs)
    wrong = []
    for argv, error in zip(argvs, errors):
        path = " ".join(argv)
        if path in tree and tree[path]["commands"]:
            continue     # a group named as a whole (`oncelog acl`)
        if error is not None and "Missing argument" not in error and "Missing option" not in error:
            wrong.append(f"oncelog {path}: {error}")   # the table leaves out arguments, not names
    assert not wrong, wrong
    named = {argv[0] for argv in argvs}
    assert named == set(tree[""]["commands"]), set(tree[""]["commands"]) ^ named


# ------------------------------------------------------------------ the Python client

def test_the_python_client_section_names_what_the_client_has():
    from oncelog.client import AdminClient, Consumer, Producer
    from oncelog.client.types import ConsumerRecord
    section = _section(PAGE.read_text(), "## The Python client")
    classes = {"Producer": Producer, "Consumer": Consumer, "AdminClient": AdminClient}
    for cls, method in re.findall(r"`(Producer|Consumer|AdminClient)\.(\w+)", section):
        assert hasattr(classes[cls], method), f"{cls}.{method}"
    assert "there is **no `poll()`**" in section and not hasattr(Producer, "poll") and not hasattr(Producer, "__len__")
    consumer = section[section.index("- `Consumer.poll(timeout)`"):section.index("\n- **`auto.offset.reset`")]
    same = consumer[consumer.index("`assign`"):consumer.index("are confluent-kafka's")]
    for name in re.findall(r"`(\w+)", re.sub(r"\([^)]*\)", "", same)):
        assert hasattr(Consumer, name), f"Consumer.{name}"
    fields = consumer[consumer.index("named tuple whose"):consumer.index("are attributes")]
    assert set(re.findall(r"`(\w+)`", fields)) <= set(ConsumerRecord._fields)
    assert "`async for record in consumer`" in section


# ------------------------------------------------------------------ topic configs

# Kafka's topic configs (TopicConfig, Kafka 3.9 and 4.x, those 4.0 removed included)
KAFKA_TOPIC_CONFIGS = frozenset({
    "cleanup.policy", "compression.type", "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
    "delete.retention.ms", "file.delete.delay.ms", "flush.messages", "flush.ms",
    "follower.replication.throttled.replicas",
    "index.interval.bytes", "leader.replication.throttled.replicas", "local.retention.bytes", "local.retention.ms",
    "max.compaction.lag.ms", "max.message.bytes", "message.downconversion.enable", "message.format.version",
    "message.timestamp.after.max.ms", "message.timestamp.before.max.ms", "message.timestamp.difference.max.ms",
    "message.timestamp.type", "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "min.insync.replicas",
    "preallocate", "remote.storage.enable", "remote.log.copy.disable", "remote.log.delete.on.disable",
    "retention.bytes", "retention.ms", "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "unclean.leader.election.enable",
})


def test_every_kafka_topic_config_oncelog_refuses_is_named():
    from oncelog.core.topic_config import TOPIC_CONFIGS
    section = _section(PAGE.read_text(), "## Settings without effect")
    said = section[section.index("**Topic configs of features oncelog lacks**"):]
    said = said[:said.index("\n- ")]
    named = set(re.findall(r"`([a-z][a-z0-9.]+)`", said))
    refused = KAFKA_TOPIC_CONFIGS - set(TOPIC_CONFIGS)
    assert refused <= named, f"Kafka topic configs oncelog refuses, not named: {refused - named}"
    assert not named & set(TOPIC_CONFIGS), named & set(TOPIC_CONFIGS)
