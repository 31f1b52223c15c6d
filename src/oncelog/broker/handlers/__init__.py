"""One module per Kafka API. Each has `API_KEY` and `async def handle(broker, version, request)`,
which returns the response body (None: no response, for Produce with acks=0) and may wait (Fetch
long polls, InitProducerId may ask the controller, JoinGroup and SyncGroup wait for the
rebalance, an acks=all Produce for its fsync). `broker` is what a handler may use of its broker,
typed (`broker.services.BrokerServices`), so mypy checks every handler strictly.

`APIS` adds to each how its request is decoded (kio, unless the module writes its own `decode`)
and how an error answers it (Kafka's `getErrorResponse`: the module's `error_response` where the
response names the request's resources, else the response's top-level error code). The broker's
dispatch (`Dispatcher.handle`) is the only caller: it decodes, then handles, and answers a
handler that raises with `error_response`."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, NamedTuple

from oncelog.broker.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    alter_client_quotas,
    alter_configs,
    alter_share_group_offsets,
    alter_user_scram_credentials,
    api_versions,
    consumer_group_describe,
    consumer_group_heartbeat,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_groups,
    delete_records,
    delete_share_group_offsets,
    delete_topics,
    describe_acls,
    describe_client_quotas,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_log_dirs,
    describe_producers,
    describe_share_group_offsets,
    describe_transactions,
    describe_user_scram_credentials,
    end_txn,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    list_transactions,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    share_acknowledge,
    share_fetch,
    share_group_describe,
    share_group_heartbeat,
    sync_group,
    txn_offset_commit,
    update_features,
    write_txn_markers,
)
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol import produce as produce_wire
from oncelog.protocol.fetch import OpaqueRecords


class Api(NamedTuple):
    key: int
    decode: Callable[[int, memoryview], Any]           # (version, body) -> request; raises on bad bytes
    # (broker, version, request) -> the body; a Fetch's may hold record sets to send unread
    handle: Callable[[BrokerServices, int, Any], Awaitable[bytes | list[bytes | OpaqueRecords] | None]]
    error_response: Callable[[int, Any, int], bytes | None]     # (version, request, error code)


def _top_level_error(api_key: int, version: int, request: Any, code: int) -> bytes:
    return entities.ResponseBuilder(api_key, version).encode_error(code)


def _api(module: Any, decode: Callable[[int, memoryview], Any] | None = None,
         error_response: Callable[[int, Any, int], bytes | None] | None = None) -> Api:
    key = int(module.API_KEY)
    return Api(key, decode or partial(entities.decode_request, key), module.handle,
               error_response or partial(_top_level_error, key))


APIS: dict[int, Api] = {api.key: api for api in (
    _api(add_offsets_to_txn),
    _api(add_partitions_to_txn, error_response=add_partitions_to_txn.error_response),
    _api(alter_client_quotas, error_response=alter_client_quotas.error_response),
    _api(alter_configs, error_response=alter_configs.error_response),
    _api(alter_share_group_offsets, error_response=alter_share_group_offsets.error_response),
    _api(create_acls, decode=create_acls.decode, error_response=create_acls.error_response),
    _api(delete_acls, decode=delete_acls.decode, error_response=delete_acls.error_response),
    _api(describe_acls, decode=describe_acls.decode),
    _api(describe_client_quotas),
    _api(alter_user_scram_credentials, error_response=alter_user_scram_credentials.error_response),
    _api(describe_user_scram_credentials),
    _api(sasl_handshake),
    _api(sasl_authenticate),
    _api(api_versions, decode=api_versions.decode),
    _api(consumer_group_describe, error_response=consumer_group_describe.error_response),
    _api(consumer_group_heartbeat),
    _api(create_partitions, error_response=create_partitions.error_response),
    _api(create_topics, error_response=create_topics.error_response),
    _api(delete_groups, error_response=delete_groups.error_response),
    _api(delete_records, error_response=delete_records.error_response),
    _api(delete_share_group_offsets, error_response=delete_share_group_offsets.error_response),
    _api(delete_topics, error_response=delete_topics.error_response),
    _api(describe_cluster),
    _api(describe_configs, error_response=describe_configs.error_response),
    _api(describe_groups, error_response=describe_groups.error_response),
    _api(describe_log_dirs),
    _api(describe_producers, error_response=describe_producers.error_response),
    _api(describe_share_group_offsets, error_response=describe_share_group_offsets.error_response),
    _api(describe_transactions, error_response=describe_transactions.error_response),
    _api(end_txn),
    _api(fetch, error_response=fetch.error_response),
    _api(find_coordinator, error_response=find_coordinator.error_response),
    _api(heartbeat),
    _api(incremental_alter_configs, error_response=incremental_alter_configs.error_response),
    _api(init_producer_id),
    _api(join_group),
    _api(leave_group),
    _api(list_groups),
    _api(list_offsets, error_response=list_offsets.error_response),
    _api(list_transactions),
    _api(metadata, error_response=metadata.error_response),
    _api(offset_commit, error_response=offset_commit.error_response),
    _api(offset_delete, error_response=offset_delete.error_response),
    _api(offset_fetch, error_response=offset_fetch.error_response),
    _api(produce, decode=produce_wire.decode_request, error_response=produce.error_response),
    _api(share_acknowledge, error_response=share_acknowledge.error_response),
    _api(share_fetch, error_response=share_fetch.error_response),
    _api(share_group_describe, error_response=share_group_describe.error_response),
    _api(share_group_heartbeat),
    _api(sync_group),
    _api(txn_offset_commit, error_response=txn_offset_commit.error_response),
    _api(update_features, error_response=update_features.error_response),
    _api(write_txn_markers, error_response=write_txn_markers.error_response),
)}
