"""Dynamic broker configs (Kafka's KIP-226): which broker configs AlterConfigs and
IncrementalAlterConfigs may change on a BROKER resource, and the store of those changes in the
controller's metadata log.

A BROKER resource is a broker id (per-broker configs, Kafka's DYNAMIC_BROKER_CONFIG) or the empty
name (the cluster-wide default, DYNAMIC_DEFAULT_BROKER_CONFIG); a per-broker value wins over the
default, which wins over server.properties. Which names are dynamic is Kafka's
`DynamicBrokerConfig.AllDynamicConfigs` (kafka/server/DynamicBrokerConfig.scala: the log-config
synonyms but `log.message.format.version`, the log cleaner's, the thread pools', the listener and
SASL/SSL configs, the socket server's connection limits, the producer-state ones, remote storage's),
each with Kafka's type; listener and SASL configs are per-broker only. Kafka's refusals and
messages: a known non-dynamic name "Cannot update these configs dynamically: Set(...)", an SSL
store config without a `listener.name.<l>.` prefix, a per-broker config at the cluster level.
Unlike Kafka, a name Kafka does not define is refused too (Kafka keeps it as a custom property for
plugins; oncelog has none to read it).

Records (Kafka's ConfigRecord for a BROKER resource):
    {"type": "broker_config", "broker": "1" | "", "name": str, "value": str | null}
a null value removes the name. `BrokerConfigStore` decides and replays them.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oncelog.core.topic_config import TOPIC_CONFIGS, ConfigError, alter_list

BROKER_CONFIG_RECORD = "broker_config"
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

# Kafka's SslConfigs.RECONFIGURABLE_CONFIGS: dynamic only per listener (`listener.name.<l>.<name>`)
_SSL_STORES: dict[str, str] = {
    "ssl.keystore.type": "string", "ssl.keystore.location": "string", "ssl.keystore.password": "password",
    "ssl.key.password": "password", "ssl.truststore.type": "string", "ssl.truststore.location": "string",
    "ssl.truststore.password": "password", "ssl.keystore.certificate.chain": "password",
    "ssl.keystore.key": "password", "ssl.truststore.certificates": "password",
}
# DynamicListenerConfig.ReconfigurableConfigs (minus the SSL stores above, which it also lists)
_LISTENER: dict[str, str] = {
    "advertised.listeners": "string", "listeners": "string", "listener.security.protocol.map": "string",
    "principal.builder.class": "class", "ssl.protocol": "string", "ssl.provider": "string",
    "ssl.cipher.suites": "list", "ssl.enabled.protocols": "list", "ssl.keymanager.algorithm": "string",
    "ssl.trustmanager.algorithm": "string", "ssl.endpoint.identification.algorithm": "string",
    "ssl.secure.random.implementation": "string", "ssl.client.auth": "string",
    "ssl.engine.factory.class": "class", "sasl.mechanism.inter.broker.protocol": "string",
    "sasl.jaas.config": "password", "sasl.enabled.mechanisms": "list", "sasl.kerberos.service.name": "string",
    "sasl.kerberos.kinit.cmd": "string", "sasl.kerberos.ticket.renew.window.factor": "double",
    "sasl.kerberos.ticket.renew.jitter": "double", "sasl.kerberos.min.time.before.relogin": "long",
    "sasl.kerberos.principal.to.local.rules": "list", "sasl.login.refresh.window.factor": "double",
    "sasl.login.refresh.window.jitter": "double", "sasl.login.refresh.min.period.seconds": "short",
    "sasl.login.refresh.buffer.seconds": "short",
    "max.connections": "int", "max.connection.creation.rate": "int", "num.network.threads": "int",
}
# the listener configs Kafka takes at the cluster level too (ClusterLevelListenerConfigs)
_CLUSTER_LEVEL_LISTENER = frozenset({"max.connections", "max.connection.creation.rate", "num.network.threads"})
# ServerTopicConfigSynonyms' broker names Kafka serves and oncelog has no topic config for
_OTHER_LOG: dict[str, str] = {
    "log.roll.jitter.ms": "long", "log.index.size.max.bytes": "int", "unclean.leader.election.enable": "boolean",
    "min.insync.replicas": "int", "compression.gzip.level": "int", "compression.lz4.level": "int",
    "compression.zstd.level": "int", "log.preallocate": "boolean",
    "log.message.timestamp.difference.max.ms": "long", "log.message.timestamp.before.max.ms": "long",
    "log.message.timestamp.after.max.ms": "long", "log.message.downconversion.enable": "boolean",
    "log.local.retention.ms": "long", "log.local.retention.bytes": "long",
}
_OTHER: dict[str, str] = {
    # LogCleaner.ReconfigurableConfigs
    "log.cleaner.threads": "int", "log.cleaner.dedupe.buffer.size": "long",
    "log.cleaner.io.buffer.load.factor": "double", "log.cleaner.io.buffer.size": "int",
    "log.cleaner.io.max.bytes.per.second": "double", "log.cleaner.backoff.ms": "long",
    # DynamicThreadPool.ReconfigurableConfigs
    "num.io.threads": "int", "num.replica.fetchers": "int", "num.recovery.threads.per.data.dir": "int",
    "background.threads": "int",
    "metric.reporters": "list",
    # SocketServer.ReconfigurableConfigs (max.connections and the creation rate are listed above)
    "max.connections.per.ip": "int", "max.connections.per.ip.overrides": "string",
    # DynamicProducerStateManagerConfig
    "producer.id.expiration.ms": "int", "transaction.partition.verification.enable": "boolean",
    # DynamicRemoteLogConfig.ReconfigurableConfigs
    "remote.log.index.file.cache.total.size.bytes": "long", "remote.fetch.max.wait.ms": "int",
    "remote.log.manager.copy.max.bytes.per.second": "long", "remote.log.manager.fetch.max.bytes.per.second": "long",
    "remote.list.offsets.request.timeout.ms": "long",
    # KIP-1191's cluster configs (GroupCoordinatorConfig's, dynamic since apache/kafka#22949)
    "errors.deadletterqueue.auto.create.topics.enable": "boolean", "errors.deadletterqueue.topic.name.prefix": "string",
}
# DynamicLogConfig: every topic config's broker synonym but the message format's
_LOG: dict[str, str] = {d.server_name: d.kind for d in TOPIC_CONFIGS.values()
                        if d.server_name and d.name != "message.format.version"}

# name -> Kafka's type, for every config Kafka changes at runtime
DYNAMIC: dict[str, str] = {**_SSL_STORES, **_LISTENER, **_OTHER_LOG, **_OTHER, **_LOG}
PER_BROKER = frozenset((set(_SSL_STORES) | set(_LISTENER)) - _CLUSTER_LEVEL_LISTENER)
# defaults of the list configs, which APPEND and SUBTRACT start from when nothing is set (Kafka's)
LIST_DEFAULTS: dict[str, str] = {
    "ssl.cipher.suites": "", "ssl.enabled.protocols": "TLSv1.2,TLSv1.3", "sasl.enabled.mechanisms": "GSSAPI",
    "sasl.kerberos.principal.to.local.rules": "DEFAULT", "metric.reporters": "",
    **{d.server_name: d.default for d in TOPIC_CONFIGS.values() if d.server_name and d.kind == "list"},
}
_LISTENER_PREFIX = re.compile(r"listener\.name\.[^.]*\.(.*)")
_MECHANISM_CONFIGS = ("sasl.jaas.config", "sasl.login.callback.handler.class", "sasl.login.class",
                      "sasl.server.callback.handler.class", "connections.max.reauth.ms")


def base_name(name: str) -> str:
    """The config a `listener.name.<l>.[<mechanism>.]<config>` name sets, else the name itself."""
    m = _LISTENER_PREFIX.fullmatch(name)
    if m is None:
        return name
    base = m.group(1)
    return next((c for c in _MECHANISM_CONFIGS if base.endswith(c)), base)


def kind(name: str) -> str | None:
    """Kafka's type of a dynamic config (listener-prefixed names by their base), None if not dynamic."""
    base = base_name(name)
    if base != name and base not in _SSL_STORES and base not in _LISTENER:
        return None
    return DYNAMIC.get(base)


def is_sensitive(name: str) -> bool:
    return kind(name) == "password"


def check_names(names: Iterable[str], per_broker: bool) -> None:
    """Kafka's DynamicBrokerConfig.validateConfigs, the name part (ConfigError with its message)."""
    names = sorted(set(names))
    refused = [n for n in names if kind(n) is None]
    if refused:
        raise ConfigError(f"Cannot update these configs dynamically: Set({', '.join(refused)})")
    unprefixed = [n for n in names if n in _SSL_STORES]
    if unprefixed:
        raise ConfigError("These security configs can be dynamically updated only per-listener using the "
                          f"listener prefix: Set({', '.join(unprefixed)})")
    if not per_broker:
        local = [n for n in names if n in PER_BROKER
                 or (n != base_name(n) and base_name(n) not in _CLUSTER_LEVEL_LISTENER)]
        if local:
            raise ConfigError("Cannot update these configs at default cluster level, broker id must be "
                              f"specified: Set({', '.join(local)})")


def apply_ops(current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]]) -> dict[str, str]:
    """A scope's configs after IncrementalAlterConfigs' (name, operation, value) ops, Kafka's
    prepareIncrementalConfigs: APPEND/SUBTRACT on list configs only, from the stored value or
    Kafka's default."""
    out = dict(current)
    for name, op, value in ops:
        if op == SET:
            out[name] = "" if value is None else value
        elif op == DELETE:
            out.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if kind(name) != "list":
                verb = "append" if op == APPEND else "subtract"
                raise ConfigError(f"Config value {verb} is not allowed for config key: {name}")
            start = out.get(name, LIST_DEFAULTS.get(base_name(name), ""))
            out[name] = alter_list(start, value or "", op == APPEND)
        else:
            raise ConfigError(f"Unknown operations type {op}")
    return out


@dataclass
class BrokerConfigStore:
    """Dynamic broker configs by scope: "" the cluster-wide default, "<id>" one broker."""
    scopes: dict[str, dict[str, str]] = field(default_factory=dict)

    def get(self, scope: str) -> dict[str, str]:
        return dict(self.scopes.get(scope, {}))

    def decide(self, scope: str, wanted: Mapping[str, str]) -> list[dict[str, Any]]:
        """Records that turn the scope's configs into exactly `wanted` (nothing if already so)."""
        current = self.scopes.get(scope, {})
        records = [_record(scope, n, v) for n, v in sorted(wanted.items()) if current.get(n) != v]
        records += [_record(scope, n, None) for n in sorted(current) if n not in wanted]
        return records

    def replay(self, record: Mapping[str, Any]) -> None:
        scope, name, value = record.get("broker"), record.get("name"), record.get("value")
        if not isinstance(scope, str) or not isinstance(name, str) or not (value is None or isinstance(value, str)):
            raise ValueError(f"malformed broker config record: {record!r}")
        configs = self.scopes.setdefault(scope, {})
        if value is None:
            configs.pop(name, None)
            if not configs:
                del self.scopes[scope]
        else:
            configs[name] = value

    def to_snapshot(self) -> list[dict[str, Any]]:
        return [_record(s, n, v) for s, configs in sorted(self.scopes.items()) for n, v in sorted(configs.items())]

    @classmethod
    def from_snapshot(cls, records: Iterable[Mapping[str, Any]]) -> BrokerConfigStore:
        store = cls()
        for r in records:
            store.replay(r)
        return store


def _record(scope: str, name: str, value: str | None) -> dict[str, Any]:
    return {"type": BROKER_CONFIG_RECORD, "broker": scope, "name": name, "value": value}
