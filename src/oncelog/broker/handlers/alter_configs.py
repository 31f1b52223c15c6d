"""AlterConfigs (API 33), v0-v2, the legacy form: a resource's configs are replaced wholesale by
the configs given (a name left out reverts to its default), as Kafka's legacyAlterConfigs does;
validate_only checks without changing anything. A topic's overrides, or on a BROKER resource (a
broker id, or the empty name for the cluster-wide default) Kafka's dynamic broker configs
(`broker.dynamic_config`). Needs ALTER_CONFIGS on the resource (the cluster for a broker). An
internal topic's `cleanup.policy` stays `compact` (`broker.security.internal_topics`)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.handlers import incremental_alter_configs
from oncelog.broker.security import internal_topics
from oncelog.broker.services import BrokerServices
from oncelog.core.broker_config import DELETE, SET
from oncelog.core.topic_config import parse_topic_configs
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.ALTER_CONFIGS


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    return await incremental_alter_configs.alter_each(broker, API_KEY, version, request, _replace_broker,
                                                      _replace_topic)


async def _replace_broker(broker: BrokerServices, name: str, configs: Any, validate_only: bool) -> None:
    given = [(c.name, SET, c.value) for c in configs]
    names = {c.name for c in configs}
    dropped = [(n, DELETE, None) for n in sorted(broker.dynamic_config.store.get(name)) if n not in names]
    await broker.dynamic_config.alter(name, given + dropped, validate_only)


async def _replace_topic(broker: BrokerServices, topic: str, configs: Any, validate_only: bool) -> None:
    info = broker.logs.topics.get(topic)
    if info is None:
        raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
    wanted = {c.name: c.value for c in configs if c.value is not None}
    parse_topic_configs(wanted)
    internal_topics.check_overrides(topic, wanted)
    if not validate_only:
        await broker.logs.alter_topic_config(topic, wanted, [k for k in info.overrides if k not in wanted])


def error_response(version: int, request: Any, code: int) -> bytes:
    return incremental_alter_configs.error_response(version, request, code, api_key=API_KEY)
