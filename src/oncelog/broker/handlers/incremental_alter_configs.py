"""IncrementalAlterConfigs (API 44), v0-v1: set or delete topic overrides at runtime. A new
`producer.state.batches.to.retain` applies to the next batches, without a restart (KIP-1269).
On a BROKER resource (a broker id, or the empty name for the cluster-wide default): Kafka's
dynamic broker configs, kept in the controller's metadata log (`broker.dynamic_config`).
APPEND and SUBTRACT work on list configs (`cleanup.policy`). All of a resource's changes are
validated before any is applied; an internal topic's `cleanup.policy` stays `compact`
(`broker.security.internal_topics`). Needs ALTER_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED) or
the cluster for broker settings (CLUSTER_AUTHORIZATION_FAILED). On a GROUP resource: a share
group's configs (`share.auto.offset.reset`, `share.isolation.level`,
`share.record.lock.duration.ms`, KIP-1191's `errors.deadletterqueue.topic.name` and
`errors.deadletterqueue.copy.record.enable`; SET and DELETE; other names INVALID_CONFIG),
ALTER_CONFIGS on the group (GROUP_AUTHORIZATION_FAILED)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from oncelog.broker.security import internal_topics
from oncelog.broker.security.authorization import Op, config_denied
from oncelog.broker.services import BrokerServices
from oncelog.core.topic_config import TOPIC_CONFIGS, alter_list, parse_topic_configs
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.fence import Fenced

API_KEY = ApiKey.INCREMENTAL_ALTER_CONFIGS
TOPIC, BROKER, GROUP = 2, 4, 32
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    return await alter_each(broker, API_KEY, version, request, _alter_broker, _alter_topic, _alter_group)


# A resource's change: (broker, resource name, the request's configs for it, validate_only)
Alter = Callable[[BrokerServices, str, Any, bool], Awaitable[None]]


async def alter_each(broker: BrokerServices, api_key: int, version: int, request: Any, alter_broker: Alter,
                     alter_topic: Alter, alter_group: Alter | None = None) -> bytes:
    """The per-resource loop of AlterConfigs and IncrementalAlterConfigs: each resource is
    authorized, changed by its type, and answered on its own (a refused one leaves the others
    changed, as Kafka answers)."""
    rb = entities.ResponseBuilder(api_key, version)
    responses = []
    for res in request.resources:
        rtype, rname = int(res.resource_type), str(res.resource_name)
        code: int = ErrorCode.NONE
        message: str | None = None
        try:
            denied = config_denied(broker, Op.ALTER_CONFIGS, rtype, rname)
            if denied is not None:
                raise KafkaProtocolError(denied, None)
            alter = {BROKER: alter_broker, TOPIC: alter_topic, GROUP: alter_group}.get(rtype)
            if alter is None:
                raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"Unknown resource type {rtype}")
            await alter(broker, rname, res.configs, request.validate_only)
        except KafkaProtocolError as e:
            code, message = e.code, e.message
        responses.append(rb("AlterConfigsResourceResponse", error_code=code, error_message=message,
                            resource_type=rtype, resource_name=rname))
    return rb.encode(throttle_time=0, responses=tuple(responses))


async def _alter_broker(broker: BrokerServices, name: str, configs: Any, validate_only: bool) -> None:
    await broker.dynamic_config.alter(name, [(c.name, int(c.config_operation), c.value) for c in configs],
                                      validate_only)


async def _alter_group(broker: BrokerServices, group: str, configs: Any, validate_only: bool) -> None:
    to_set: dict[str, str] = {}
    to_delete: list[str] = []
    for c in configs:
        op = int(c.config_operation)
        if op == SET:
            to_set[c.name] = c.value or ""
        elif op == DELETE:
            to_delete.append(c.name)
        else:
            raise KafkaProtocolError(ErrorCode.INVALID_CONFIG, f"{c.name}: APPEND/SUBTRACT apply to list configs only")
    if not validate_only and not broker.coordinates(group):
        # a group's configs are kept with its state, under its coordinator's lease (Kafka keeps
        # them in the metadata log, so any broker takes them; here the client asks the coordinator)
        raise KafkaProtocolError(ErrorCode.NOT_COORDINATOR, f"group {group}'s configs are changed at its coordinator")
    try:
        broker.groups.share.alter_group_configs(group, to_set, to_delete, validate_only)
    except Fenced:   # the group moved away between the check and the write
        raise KafkaProtocolError(ErrorCode.NOT_COORDINATOR, f"group {group} is coordinated elsewhere now") from None


async def _alter_topic(broker: BrokerServices, topic: str, configs: Any, validate_only: bool) -> None:
    if topic not in broker.logs.topics:
        raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
    to_set, to_delete = {}, []
    for c in configs:
        op = int(c.config_operation)
        if op == SET:
            to_set[c.name] = c.value
        elif op == DELETE:
            to_delete.append(c.name)
        else:
            to_set[c.name] = _list_op(broker, topic, to_set, c.name, c.value, op == APPEND)
    after = {**broker.logs.topics[topic].overrides, **to_set}
    internal_topics.check_overrides(topic, {k: v for k, v in after.items() if k not in to_delete})
    if not validate_only:
        await broker.logs.alter_topic_config(topic, to_set, to_delete)
    else:
        parse_topic_configs(to_set)


def _list_op(broker: BrokerServices, topic: str, pending: dict[str, str], name: str, value: str | None,
             append: bool) -> str:
    """APPEND / SUBTRACT on a list config, from the topic's override (or an earlier change in
    this request), else the config's default, as Kafka's ConfigAdminManager does."""
    definition = TOPIC_CONFIGS.get(name)
    if definition is None or definition.kind != "list":
        raise KafkaProtocolError(ErrorCode.INVALID_CONFIG, f"{name}: APPEND/SUBTRACT apply to list "
                                 "configs only")
    current = pending.get(name, broker.logs.topics[topic].overrides.get(name, definition.default))
    return alter_list(current, value or "", append)


def error_response(version: int, request: Any, code: int, api_key: int = API_KEY) -> bytes:
    """Every resource refused with `code` (AlterConfigs answers the same shape)."""
    rb = entities.ResponseBuilder(api_key, version)
    return rb.encode_error(code, responses=tuple(
        rb.error("AlterConfigsResourceResponse", code, error_message=None, resource_type=res.resource_type,
                 resource_name=res.resource_name)
        for res in request.resources))
