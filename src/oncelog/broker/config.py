"""Broker settings under Kafka's names: type, default, validation, and which may change at runtime.

Sources, later ones winning: Kafka's defaults, a `server.properties` file, `--override name=value`.
Topic-level settings take their server-wide default from their `log.`-prefixed twin
(`core.topic_config`); Kafka's hour/minute synonyms (`log.retention.hours`, `log.roll.hours`) are
read the way Kafka reads them so an existing server.properties keeps its meaning.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from oncelog.core.properties import parse_properties
from oncelog.core.security.listeners import (
    SECURITY_SETTINGS,
    Endpoint,
    ListenerSetup,
    TlsSettings,
    listener_value,
    parse_listener_setup,
    split_listener_key,
    tls_settings,
)
from oncelog.core.topic_config import SERVER_NAME_TO_TOPIC, TOPIC_CONFIGS, ConfigDef, ConfigError

log = logging.getLogger(__name__)

def _host_port(value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{value!r} is not host:port (a port from 0 to 65535)")


def _rebalance_protocols(value: str) -> None:
    names = {v.strip().lower() for v in value.split(",") if v.strip()}
    unknown = names - {"classic", "consumer"}
    if unknown:
        raise ConfigError(f"{', '.join(sorted(unknown))}: oncelog serves the classic and consumer protocols")
    if "classic" not in names:
        raise ConfigError("the classic protocol cannot be disabled (Kafka's rule)")


def _assignors(value: str) -> None:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in ("uniform", "range")]
    if not names or unknown:
        raise ConfigError(f"{', '.join(unknown) or 'none'}: the server assignors are uniform and range")


_BROKER_ONLY = (
    ConfigDef("listeners", "string", "PLAINTEXT://127.0.0.1:9092",
              "Where the broker listens: NAME://host:port,... with NAME mapped to PLAINTEXT, SSL, "
              "SASL_PLAINTEXT or SASL_SSL by listener.security.protocol.map (port 0 picks a free port)."),
    ConfigDef("advertised.listeners", "string", "", "What clients are told to connect to, per "
              "listener name (default: the bound listener)."),
    ConfigDef("log.dirs", "string", "./data", "Comma-separated data directories."),
    ConfigDef("storage.min.free.bytes", "long", 64 * 1024 * 1024, "Redpanda's storage_min_free_bytes: "
              "below this much free space on a data directory's filesystem, Produce to its partitions "
              "is refused with KAFKA_STORAGE_ERROR (producers retry), keeping the rest for offset "
              "commits, transaction markers, snapshots and the metadata log; 0 turns the reserve off.",
              minimum=0),
    ConfigDef("node.id", "int", 1, "This broker's id.", minimum=0),
    ConfigDef("cluster.id", "string", "", "Cluster id (default: generated once and kept in log.dirs)."),
    ConfigDef("num.partitions", "int", 1, "Partitions of auto-created topics and CreateTopics "
              "without a count.", minimum=1),
    ConfigDef("default.replication.factor", "int", 1, "Accepted for compatibility; oncelog keeps "
              "one copy (a single replica per partition).", minimum=1, maximum=1),
    ConfigDef("auto.create.topics.enable", "boolean", True, "Create a topic on first Metadata or "
              "Produce for it."),
    ConfigDef("socket.request.max.bytes", "int", 104857600, "Largest request frame; a bigger one "
              "closes the connection before anything is allocated.", minimum=1),
    ConfigDef("fetch.max.bytes", "int", 57671680, "The most record bytes one Fetch answers, "
              "whatever the request asks (the first batch is returned whole even if larger).",
              minimum=1024),
    ConfigDef("producer.id.expiration.ms", "int", 86400000, "Idle time after which a producer's "
              "state is removed.", minimum=1),
    ConfigDef("producer.id.expiration.check.interval.ms", "int", 600000, "How often expiry runs.",
              minimum=1),
    ConfigDef("group.initial.rebalance.delay.ms", "int", 100, "How long a new consumer group waits "
              "for more members before its first rebalance (Kafka: 3000).", minimum=0),
    ConfigDef("group.min.session.timeout.ms", "int", 6000, "Shortest session timeout a consumer "
              "group member may ask for (else INVALID_SESSION_TIMEOUT).", minimum=0),
    ConfigDef("group.max.session.timeout.ms", "int", 1800000, "Longest session timeout a consumer "
              "group member may ask for.", minimum=0),
    # KIP-848 consumer groups (Kafka 4's names and defaults)
    ConfigDef("group.coordinator.rebalance.protocols", "list", "classic,consumer", "Group protocols served: "
              "classic (JoinGroup/SyncGroup) always; consumer (KIP-848, ConsumerGroupHeartbeat) unless left out, "
              "when its APIs answer UNSUPPORTED_VERSION.", check=_rebalance_protocols),
    ConfigDef("group.consumer.heartbeat.interval.ms", "int", 5000, "How often consumer-group members "
              "heartbeat (told in every heartbeat answer).", minimum=1),
    ConfigDef("group.consumer.min.heartbeat.interval.ms", "int", 5000, "Lowest "
              "group.consumer.heartbeat.interval.ms allowed.", minimum=1),
    ConfigDef("group.consumer.max.heartbeat.interval.ms", "int", 15000, "Highest "
              "group.consumer.heartbeat.interval.ms allowed.", minimum=1),
    ConfigDef("group.consumer.session.timeout.ms", "int", 45000, "A consumer-group member without a "
              "heartbeat for this long is removed and its partitions go to the others.", minimum=1),
    ConfigDef("group.consumer.min.session.timeout.ms", "int", 45000, "Lowest "
              "group.consumer.session.timeout.ms allowed.", minimum=1),
    ConfigDef("group.consumer.max.session.timeout.ms", "int", 60000, "Highest "
              "group.consumer.session.timeout.ms allowed.", minimum=1),
    ConfigDef("group.consumer.assignors", "list", "uniform,range", "Server-side assignors of consumer groups; "
              "the first is used unless members ask for another (group.remote.assignor).", check=_assignors),
    ConfigDef("group.consumer.max.size", "int", 2147483647, "Most members of a consumer group (more get "
              "GROUP_MAX_SIZE_REACHED).", minimum=1),
    # Share groups (KIP-932; Kafka 4.2's names and defaults; docs/share-groups.md)
    ConfigDef("group.share.heartbeat.interval.ms", "int", 5000, "How often share-group members heartbeat "
              "(told in every heartbeat answer).", minimum=1),
    ConfigDef("group.share.session.timeout.ms", "int", 45000, "A share-group member without a heartbeat for "
              "this long is removed and the records it holds go back.", minimum=1),
    ConfigDef("group.share.record.lock.duration.ms", "int", 30000, "How long a share-group member holds the "
              "records it acquired before they go back to the others (the group config "
              "share.record.lock.duration.ms overrides it).", minimum=1),
    ConfigDef("group.share.delivery.count.limit", "int", 5, "Deliveries of a record to share-group members "
              "before it is archived.", minimum=1, maximum=10),
    ConfigDef("group.share.partition.max.record.locks", "int", 2000, "Most records of a share-partition "
              "in flight (acquired or waiting to be acquired again) at once.", minimum=1),
    ConfigDef("group.share.max.size", "int", 200, "Most members of a share group (more get "
              "GROUP_MAX_SIZE_REACHED).", minimum=1),
    ConfigDef("group.share.max.share.sessions", "int", 2000, "Most share sessions of a broker (more get "
              "SHARE_SESSION_LIMIT_REACHED).", minimum=1),
    # Dead-letter topics of share groups (KIP-1191; dynamic cluster configs, as in Kafka)
    ConfigDef("errors.deadletterqueue.auto.create.topics.enable", "boolean", False, "Create a share group's "
              "dead-letter topic (with errors.deadletterqueue.group.enable=true) when it is first written and "
              "does not exist; false: a group whose topic does not exist archives without dead-letter records."),
    ConfigDef("errors.deadletterqueue.topic.name.prefix", "string", "dlq.", "The prefix every share group's "
              "dead-letter topic name must have (empty: any name)."),
    ConfigDef("offset.metadata.max.bytes", "int", 4096, "Longest metadata string of a committed offset "
              "(OffsetCommit, TxnOffsetCommit); a longer one is refused OFFSET_METADATA_TOO_LARGE.", minimum=0),
    ConfigDef("offsets.retention.minutes", "int", 10080, "How long committed offsets outlive their "
              "group: from when it became empty, or from the commit for a group without members.",
              minimum=1),
    ConfigDef("offsets.retention.check.interval.ms", "long", 600000, "How often expired committed "
              "offsets are removed.", minimum=1),
    ConfigDef("log.cleaner.enable", "boolean", True, "Run the log cleaner for topics with "
              "cleanup.policy=compact (a thread; passes start from the periodic maintenance)."),
    ConfigDef("log.cleaner.dedupe.buffer.size", "long", 128 << 20, "Memory for the cleaner's key -> "
              "offset map: at most this / 128 keys per pass (a Python dict entry costs about 128 "
              "bytes; Kafka's 24-byte entries hold more per byte).", minimum=1 << 16),
    ConfigDef("log.retention.check.interval.ms", "long", 300000, "How often retention and the "
              "flush policy run.", minimum=1),
    ConfigDef("controller.quorum.bootstrap.servers", "string", "", "The controller's listener "
              "(host:port). Empty: `oncelog serve` runs a controller in-process on loopback."),
    ConfigDef("controller.listener", "string", "127.0.0.1:0", "host:port of the controller `oncelog serve` runs "
              "in-process (when controller.quorum.bootstrap.servers is empty); port 0 picks a free port. A fixed "
              "port lets a firewall or a second tool find it.", check=_host_port),
    ConfigDef("controller.listener.names", "string", "", "The controller's listener name; mapped to SSL or "
              "SASL_SSL in listener.security.protocol.map, the broker reaches the controller over TLS, trusting "
              "listener.name.<name>.ssl.truststore.location."),
    ConfigDef("controller.sasl.plain.username", "string", "", "SASL/PLAIN user for the controller listener."),
    ConfigDef("controller.sasl.plain.password", "string", "", "SASL/PLAIN password for the controller listener."),
    ConfigDef("oncelog.cluster", "boolean", False, "Run as one broker of a cluster on one machine: "
              "log.dirs is shared with the other brokers and this broker leads the partitions the "
              "controller assigns it (set by `oncelog serve --brokers N`)."),
    ConfigDef("producer.id.block.prefetch", "boolean", True, "Ask the controller for the next "
              "producer-id block at 90% use (KIP-730); off only to measure what prefetch saves."),
    ConfigDef("broker.heartbeat.interval.ms", "int", 500, "Heartbeats to the controller (Kafka: 2000).",
              minimum=10),
    ConfigDef("metrics.port", "int", -1, "Prometheus /metrics HTTP port (-1: off, 0: any free "
              "port).", minimum=-1, maximum=65535),
    ConfigDef("metrics.host", "string", "127.0.0.1", "Address of the /metrics endpoint (loopback by "
              "default: it names topics and groups)."),
    ConfigDef("metrics.web.config.file", "string", "", "TLS and basic authentication of /metrics, in the "
              "Prometheus exporters' web configuration format (tls_server_config, basic_auth_users)."),
    ConfigDef("metrics.resource.labels.enable", "boolean", True, "Label metrics by topic, partition and "
              "group; false: sums per broker, no topic or group name on the endpoint."),
    # Transactions (docs/transactions.md), Kafka's names and defaults.
    ConfigDef("transaction.state.log.num.partitions", "int", 50, "Partitions of __transaction_state, "
              "fixed when the topic is created on the first transactional request.", minimum=1),
    ConfigDef("transaction.state.log.segment.bytes", "int", 104857600, "Segment size of "
              "__transaction_state.", minimum=1024),
    ConfigDef("transaction.max.timeout.ms", "int", 900000, "Largest transaction.timeout.ms a "
              "producer may ask for (else INVALID_TRANSACTION_TIMEOUT).", minimum=1),
    ConfigDef("transaction.two.phase.commit.enable", "boolean", False, "KIP-939: whether producers may "
              "open two-phase commit transactions (InitProducerId v6 with Enable2Pc), which the "
              "coordinator never aborts by timeout and a restarted producer can keep "
              "(KeepPreparedTxn); false answers Enable2Pc with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "
              "as Kafka does."),
    ConfigDef("transactional.id.expiration.ms", "int", 604800000, "Idle time after which a "
              "transactional id with no open transaction is forgotten.", minimum=1),
    ConfigDef("transaction.partition.verification.enable", "boolean", True, "KIP-890 part 1: a partition "
              "leader asks the transaction coordinator before it appends a producer's first transactional "
              "batch of a transaction; false accepts transactional batches unverified (a hanging "
              "transaction then becomes possible, as in Kafka). Transactions V2 clients' batches "
              "are added to their transaction by the leader whatever this says."),
    ConfigDef("add.partitions.to.txn.retry.backoff.ms", "int", 20, "Transactions V2: how long a "
              "partition leader waits before it asks a transaction coordinator on another broker again "
              "to add a partition, after CONCURRENT_TRANSACTIONS (the previous transaction still writes "
              "its markers); a coordinator on this broker is asked again as soon as it can answer.",
              minimum=1),
    ConfigDef("add.partitions.to.txn.retry.backoff.max.ms", "int", 100, "Transactions V2: how long "
              "a partition leader keeps asking before it answers the producer CONCURRENT_TRANSACTIONS "
              "(at most the request's timeout).", minimum=0),
    ConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000, "How "
              "often transactions open longer than their timeout are aborted.", minimum=1),
    ConfigDef("transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3600000, "How "
              "often expired transactional ids are removed.", minimum=1),
    ConfigDef("offsets.topic.num.partitions", "int", 50, "Partitions of __consumer_offsets that "
              "groups hash to; AddOffsetsToTxn adds the group's one to the transaction.", minimum=1),
    ConfigDef("log.retention.hours", "long", None, "Kafka's synonym: retention.ms in hours."),
    ConfigDef("log.retention.minutes", "long", None, "Kafka's synonym: retention.ms in minutes."),
    ConfigDef("log.roll.hours", "long", None, "Kafka's synonym: segment.ms in hours."),
)

# topic-level defaults under their broker names ("log.segment.bytes" ...), minus the topic name
_TOPIC_DEFAULTS = tuple(
    ConfigDef(d.server_name, d.kind, d.default, d.doc, minimum=d.minimum, maximum=d.maximum,
              choices=d.choices, check=d.check)
    for d in TOPIC_CONFIGS.values() if d.server_name)

SETTINGS: dict[str, ConfigDef] = {d.name: d for d in (*_BROKER_ONLY, *SECURITY_SETTINGS, *_TOPIC_DEFAULTS)}
SYNONYMS = {"log.dir": "log.dirs", "broker.id": "node.id"}
# dynamic broker configs (IncrementalAlterConfigs on the BROKER resource): topic defaults only
DYNAMIC = frozenset(d.name for d in _TOPIC_DEFAULTS)


# Kafka's PASSWORD-type settings (and key material, credentials): DescribeConfigs answers them
# with a null value and is_sensitive, never the text
_SENSITIVE = ("password", "ssl.keystore.key", "sasl.jaas.config", "oncelog.add.scram")


def is_sensitive(name: str) -> bool:
    return any(s in name for s in _SENSITIVE)


class BrokerConfig:
    """Typed settings by Kafka name. `config["log.segment.bytes"]`."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values = {name: d.default for name, d in SETTINGS.items()}
        # `listener.name.<l>.<setting>` overrides, kept as given (strings; JAAS values among them)
        self._per_listener: dict[str, str] = {}
        if values:
            self.update(values)

    @classmethod
    def load(cls, properties_file: str | Path | None = None,
             overrides: Mapping[str, Any] | None = None) -> BrokerConfig:
        raw: dict[str, Any] = {}
        if properties_file is not None:
            raw.update(read_properties(Path(properties_file)))
        raw.update(overrides or {})
        return cls(raw)

    def update(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            name = SYNONYMS.get(name, name)
            definition = SETTINGS.get(name)
            if definition is None and split_listener_key(name) is not None:
                self._per_listener[name] = str(value)
                continue
            if definition is None and name == "sasl.jaas.config":
                log.warning("ignoring sasl.jaas.config: a broker reads JAAS settings per listener and "
                            "mechanism (listener.name.<listener>.<mechanism>.sasl.jaas.config), as Kafka does")
                continue
            if definition is None:
                log.warning("ignoring unknown setting %r (not a config oncelog knows)", name)
                continue
            try:
                self._values[name] = definition.parse(value)
            except ConfigError as e:
                raise ConfigError(f"{name}: {e}") from None
        self._apply_synonyms(explicit=set(values))
        self.listener_setup  # noqa: B018 - parses: a bad listener stops the start
        self._check_failed_authentication_delay()
        self._check_consumer_group_timeouts()

    def _check_consumer_group_timeouts(self) -> None:
        """Kafka's GroupCoordinatorConfig rules: each value within its bounds, the heartbeat
        interval below the session timeout."""
        for what in ("heartbeat.interval", "session.timeout"):
            value = self[f"group.consumer.{what}.ms"]
            low, high = self[f"group.consumer.min.{what}.ms"], self[f"group.consumer.max.{what}.ms"]
            if not low <= value <= high:
                raise ConfigError(f"group.consumer.{what}.ms={value} must be between group.consumer.min.{what}.ms="
                                  f"{low} and group.consumer.max.{what}.ms={high}")
        if self["group.consumer.heartbeat.interval.ms"] >= self["group.consumer.session.timeout.ms"]:
            raise ConfigError("group.consumer.heartbeat.interval.ms must be less than "
                              "group.consumer.session.timeout.ms")

    def _check_failed_authentication_delay(self) -> None:
        """Kafka's KafkaConfig rule: a failed login's delayed close must come before the idle one."""
        idle = self["connections.max.idle.ms"]
        for endpoint in self.listener_setup.listeners if idle >= 0 else ():
            delay = int(self.listener_value(endpoint.name, "connection.failed.authentication.delay.ms", 100))
            if delay >= idle:
                raise ConfigError(f"connection.failed.authentication.delay.ms={delay} should always be less than "
                                  f"connections.max.idle.ms={idle} to prevent failed authentication responses "
                                  "from timing out")

    def _apply_synonyms(self, explicit: set[str]) -> None:
        # Kafka's precedence: log.retention.ms > .minutes > .hours; log.roll.ms > log.roll.hours
        hours, minutes = self._values.pop("log.retention.hours", None), self._values.pop(
            "log.retention.minutes", None)
        if "log.retention.ms" not in explicit:
            if minutes is not None:
                self._values["log.retention.ms"] = minutes * 60_000
            elif hours is not None:
                self._values["log.retention.ms"] = hours * 3_600_000
        roll = self._values.pop("log.roll.hours", None)
        if roll is not None and "log.roll.ms" not in explicit:
            self._values["log.roll.ms"] = roll * 3_600_000

    def __getitem__(self, name: str) -> Any:
        return self._values[SYNONYMS.get(name, name)]

    def get(self, name: str, default: Any = None) -> Any:
        name = SYNONYMS.get(name, name)
        if name in self._per_listener:
            return self._per_listener[name]
        return self._values.get(name, default)

    def items(self) -> Iterable[tuple[str, Any]]:
        """Every setting, `listener.name.*` overrides included (what a copy of the config needs)."""
        return {**self._values, **self._per_listener}.items()

    @property
    def listener_setup(self) -> ListenerSetup:
        return parse_listener_setup(self["listeners"], self["advertised.listeners"],
                                    self["listener.security.protocol.map"])

    @property
    def listeners(self) -> list[Endpoint]:
        return list(self.listener_setup.listeners)

    def listener_value(self, listener: str, key: str, default: Any = None) -> Any:
        """`listener.name.<listener>.<key>` if set, else `<key>` (Kafka's per-listener override)."""
        return listener_value(self._merged(), listener, key, default)

    def tls_settings(self, listener: str) -> TlsSettings:
        return tls_settings(self._merged(), listener)

    def _merged(self) -> dict[str, Any]:
        return {**self._values, **self._per_listener}

    @property
    def log_dirs(self) -> list[str]:
        return [d.strip() for d in self["log.dirs"].split(",") if d.strip()]

    def topic_defaults(self) -> dict[str, Any]:
        """Server defaults under topic-config names, for LogManager."""
        return {SERVER_NAME_TO_TOPIC[n]: self._values[n] for n in SERVER_NAME_TO_TOPIC if n in self._values}

    def producer_config(self) -> dict[str, Any]:
        return {"producer.id.expiration.ms": self["producer.id.expiration.ms"]}


def read_properties(path: Path) -> dict[str, str]:
    """Java .properties as Kafka uses them (core/properties.py): `key=value` or `key: value`, # and !
    comments, continuation lines."""
    return parse_properties(path.read_text(), str(path))


def new_cluster_id() -> str:
    """Kafka's cluster ids are 22-character url-safe base64 of a uuid."""
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
