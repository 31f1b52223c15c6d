"""This broker's dynamic configs (`core.broker_config`): checked here and forwarded to the
controller, which keeps them in its metadata log; followed back through the security feed
(`security_follower`), so every broker of a cluster applies the controller's state, and a restart
finds them again.

Effective value of a broker config: this broker's dynamic value, else the cluster-wide dynamic
default, else server.properties, else the default. What takes effect at once: the topic-config
defaults (`log.retention.ms`, `log.cleanup.policy`, `log.producer.state.batches.to.retain`,
`write.caching.default`, `compression.type`, ...: every topic without its own override follows),
`producer.id.expiration.ms`, and the connection limits (`max.connections` and
`max.connection.creation.rate`, broker-wide and per listener, `max.connections.per.ip`,
`max.connections.per.ip.overrides`). The other names Kafka makes dynamic
(thread pools, Kerberos, listener SSL stores, remote storage, ...) are stored and described but
change nothing here (docs/operations.md)."""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from oncelog.broker.config import SETTINGS, is_sensitive
from oncelog.core import broker_config as bc
from oncelog.core.security.metadata import SecurityMetadata
from oncelog.core.security.quotas import parse_per_ip_overrides
from oncelog.core.topic_config import SERVER_NAME_TO_TOPIC, ConfigDef, ConfigError
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)

# Kafka's ConfigSource ids
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 2, 3, 4, 5
_CONTROLLER_VERSION = 1


def _definition(name: str) -> ConfigDef:
    """oncelog's definition of a broker config, else one of Kafka's type (short: int16)."""
    known = SETTINGS.get(name)
    if known is not None:
        return known
    kind = bc.kind(name) or "string"
    if kind == "short":
        return ConfigDef(name, "int", None, "", minimum=-(1 << 15), maximum=(1 << 15) - 1)
    return ConfigDef(name, kind if kind in ("int", "long", "double", "boolean", "list") else "string", None, "")


class DynamicBrokerConfig:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.store = bc.BrokerConfigStore()

    @property
    def scope(self) -> str:
        return str(self.broker.node_id)

    # ------------------------------------------------------------------ reading
    def layers(self) -> tuple[dict[str, str], dict[str, str]]:
        """(cluster-wide default, this broker's) dynamic configs as stored."""
        return self.store.get(""), self.store.get(self.scope)

    def value(self, name: str) -> Any:
        """The effective, typed value of a broker config oncelog knows."""
        default, mine = self.layers()
        for layer in (mine, default):
            if name in layer:
                try:
                    return _definition(name).parse(layer[name])
                except ConfigError as e:    # stored by another version: never stops the broker
                    log.warning("dynamic broker config %s=%r does not validate (%s); ignored", name, layer[name], e)
        return self.broker.config.get(name)

    def source(self, name: str) -> int:
        default, mine = self.layers()
        if name in mine:
            return DYNAMIC_BROKER_CONFIG
        if name in default:
            return DYNAMIC_DEFAULT_BROKER_CONFIG
        definition = SETTINGS.get(name)
        if definition is not None and self.broker.config.get(name) != definition.default:
            return STATIC_BROKER_CONFIG
        return DEFAULT_CONFIG

    def entries(self, resource_name: str) -> Iterator[tuple[str, str | None, int, str, str, bool, bool]]:
        """DescribeConfigs on a BROKER resource: (name, value, source, doc, Kafka type, read-only,
        sensitive). This broker's id: every setting and every name Kafka makes dynamic; the empty
        name: the cluster-wide dynamic defaults only (Kafka's ConfigHelper)."""
        default, mine = self.layers()
        if resource_name == "":
            for name, raw in sorted(default.items()):
                yield self._entry(name, raw, DYNAMIC_DEFAULT_BROKER_CONFIG)
            return
        for name, definition in SETTINGS.items():
            value = self.value(name)
            if value is not None:
                yield self._entry(name, definition.render(value), self.source(name))
        # Kafka describes every config; of those oncelog lacks, the dynamic ones (admin clients
        # check a name against this list before they alter it), with no value until one is set
        for name in sorted((set(default) | set(mine) | set(bc.DYNAMIC)) - set(SETTINGS)):
            yield self._entry(name, mine.get(name, default.get(name)), self.source(name))

    def _entry(self, name: str, value: str | None, source: int):
        kind = bc.kind(name) or _definition(name).kind
        sensitive = kind == "password" or is_sensitive(name)
        return (name, None if sensitive else value, source, _definition(name).doc, kind, bc.kind(name) is None,
                sensitive)

    # ------------------------------------------------------------------ following the controller
    def follow(self, state: SecurityMetadata) -> None:
        self.store = state.broker_configs
        self.apply()

    def apply(self) -> None:
        """Push the effective values to the parts that read them at runtime."""
        b = self.broker
        defaults = dict(b.config.topic_defaults())
        for server_name, topic_name in SERVER_NAME_TO_TOPIC.items():
            value = self.value(server_name)
            if value is not None:
                defaults[topic_name] = value
        expiration = self.value("producer.id.expiration.ms")
        if defaults != b.logs.server_defaults or b.logs.producer_config.get("producer.id.expiration.ms") != expiration:
            b.logs.producer_config["producer.id.expiration.ms"] = expiration
            b.logs.set_server_defaults(defaults)    # every partition takes its new config
        b.connection_gate.configure(self.value)

    # ------------------------------------------------------------------ changing
    async def alter(self, resource_name: str, ops: Sequence[tuple[str, int, str | None]], validate_only: bool) -> None:
        """IncrementalAlterConfigs on a BROKER resource (AlterConfigs comes as SET and DELETE ops):
        Kafka's broker-side checks, then the controller stores it (unless validate_only); this
        broker has applied it when this returns. Raises KafkaProtocolError."""
        if resource_name not in ("", self.scope):
            raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {self.scope}, "
                                     f"but received {resource_name}")
        names = [name for name, _, _ in ops]
        if len(set(names)) != len(names):
            raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
        nulls = [name for name, op, value in ops if op != bc.DELETE and value is None]
        if nulls:
            raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}")
        try:
            bc.check_names(names, per_broker=resource_name != "")
            current = self.store.get(resource_name)
            wanted = bc.apply_ops(current, ops)
            for name, raw in wanted.items():
                if current.get(name) != raw:
                    _definition(name).parse(raw)
                    if name == "max.connections.per.ip.overrides":
                        parse_per_ip_overrides(raw)
                    if name not in SETTINGS and bc.kind(name) == "password" and resource_name == "":
                        raise ConfigError("Password config can be defined only at broker level")
        except (ConfigError, ValueError) as e:  # Kafka answers a config that fails validation so (KAFKA-13609)
            raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, str(e)) from None
        mod = entities.module(ApiKey.INCREMENTAL_ALTER_CONFIGS, _CONTROLLER_VERSION, "request")
        configs = tuple(entities.make(mod.AlterableConfig, name=n, config_operation=op, value=v) for n, op, v in ops)
        security = self.broker.security
        answer = await security.client.request(
            ApiKey.INCREMENTAL_ALTER_CONFIGS, _CONTROLLER_VERSION, validate_only=validate_only,
            resources=(entities.make(mod.AlterConfigsResource, resource_type=4, resource_name=resource_name,
                                     configs=configs),))
        result = answer.responses[0]
        if int(result.error_code):
            raise KafkaProtocolError(ErrorCode(int(result.error_code)), result.error_message)
        if not validate_only:
            await security.catch_up()
            log.info("dynamic broker configs %r: %s", resource_name or "<default>",
                     ", ".join(f"{n} {('SET', 'DELETE', 'APPEND', 'SUBTRACT')[op]}" for n, op, _ in ops))
