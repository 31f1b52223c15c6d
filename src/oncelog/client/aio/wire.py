"""The client's side of the protocol: the versions it speaks of each API, and the error its
callers see when a response does not decode.

The codecs themselves are protocol/'s and shared with the broker: `headers` (request and response
headers), `api_versions`, `metadata`, `produce`, `fetch` and `init_producer_id` (hand-written:
hot paths, our tagged fields, error codes read as integers), `entities` (kio, for the rest).
"""
from __future__ import annotations

from typing import Any

from oncelog.client.errors import KafkaClientError
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey

# versions this client can speak; the broker's ApiVersions answer narrows them
CLIENT_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 14), ApiKey.FETCH: (4, 12), ApiKey.LIST_OFFSETS: (1, 7),
    ApiKey.METADATA: (1, 12), ApiKey.API_VERSIONS: (0, 3), ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 5), ApiKey.DELETE_RECORDS: (0, 2), ApiKey.INIT_PRODUCER_ID: (0, 4),
    ApiKey.DESCRIBE_CONFIGS: (1, 4), ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0), ApiKey.FIND_COORDINATOR: (0, 4),
    # AddPartitionsToTxn v4 is the broker-to-broker form (KIP-890): clients stop at v3
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3), ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    # v5: Transactions V2, used only when the cluster finalizes transaction.version 2 (txn_core)
    ApiKey.TXN_OFFSET_COMMIT: (0, 5), ApiKey.END_TXN: (0, 5),
    # the admin client's (groups, ACLs, SCRAM users, cluster, transactions); OffsetFetch v8+ asks
    # for several groups at once, a shape this client does not use
    ApiKey.LIST_GROUPS: (0, 5), ApiKey.DESCRIBE_GROUPS: (0, 5), ApiKey.OFFSET_FETCH: (1, 7),
    ApiKey.OFFSET_COMMIT: (2, 9), ApiKey.DELETE_GROUPS: (0, 2), ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.OFFSET_DELETE: (0, 0), ApiKey.DESCRIBE_LOG_DIRS: (1, 4),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1), ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    ApiKey.DESCRIBE_ACLS: (1, 3), ApiKey.CREATE_ACLS: (1, 3), ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0), ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 1), ApiKey.DESCRIBE_TRANSACTIONS: (0, 0), ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.WRITE_TXN_MARKERS: (1, 1),
    # a consumer's group membership: the classic protocol, and KIP-848's (librdkafka's v1 only)
    ApiKey.JOIN_GROUP: (4, 7), ApiKey.SYNC_GROUP: (3, 5), ApiKey.HEARTBEAT: (3, 4), ApiKey.LEAVE_GROUP: (3, 5),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (1, 1), ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 1),
    # share groups (KIP-932; aio.share_consumer): ShareFetch/ShareAcknowledge v2 where served
    ApiKey.SHARE_GROUP_HEARTBEAT: (1, 1), ApiKey.SHARE_GROUP_DESCRIBE: (1, 1), ApiKey.SHARE_FETCH: (1, 2),
    ApiKey.SHARE_ACKNOWLEDGE: (1, 2),
    # the share groups' offsets (kafka-share-groups.sh's requests; v1 of Describe: the lag)
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1), ApiKey.ALTER_SHARE_GROUP_OFFSETS: (0, 0),
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: (0, 0),
}


def decode(api_key: int, version: int, body) -> Any:
    """A response decoded through kio, or a KafkaClientError saying why it does not decode."""
    try:
        return entities.decode_response(api_key, version, body)
    except entities.MalformedResponse as e:
        raise KafkaClientError(str(e)) from None
