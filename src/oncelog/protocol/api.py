"""API keys, the versions the broker serves, and where each API becomes flexible.

Version ranges are chosen so that confluent-kafka (librdkafka), kafka-python, aiokafka and
oncelog's own client all negotiate a version we implement (reference/clients.md lists theirs).
"""
from __future__ import annotations

from enum import IntEnum


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    UPDATE_FEATURES = 57
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92
    # controller listener
    SASL_HANDSHAKE = 17
    SASL_AUTHENTICATE = 36
    ALTER_PARTITION_REASSIGNMENTS = 45
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    ALLOCATE_PRODUCER_IDS = 67


# (min, max) served by the broker. Produce v14 is KIP-1269's (v13 on the wire + tagged fields).
BROKER_VERSIONS: dict[int, tuple[int, int]] = {
    # Produce v0-v2 (v0/v1 message sets) and Metadata v0: as Kafka 3.x, for clients told not to
    # ask ApiVersions (librdkafka's api.version.request=false); Kafka 4.0 dropped Produce v0-v2
    ApiKey.PRODUCE: (0, 14),
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 10),
    ApiKey.METADATA: (0, 12),
    # OffsetCommit v9 and OffsetFetch v9 carry a consumer group member's epoch (KIP-848)
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 9),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 7),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 4),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.INIT_PRODUCER_ID: (0, 6),   # v6: KIP-939 (Enable2Pc, KeepPreparedTxn)
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.DESCRIBE_LOG_DIRS: (1, 4),  # kafka-log-dirs.sh, `rpk cluster logdirs`; v4: volume bytes (KIP-827)
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    # KIP-848 consumer groups (docs/operations.md "Consumer groups"); librdkafka heartbeats with v1 only
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 1),
    # Transactions (docs/transactions.md "Versions"), V1 and V2 side by side: EndTxn v5, Produce
    # v12+ and TxnOffsetCommit v5 are Transactions V2 (KIP-890 part 2; the transaction.version
    # feature tells clients to use them); AddPartitionsToTxn v4-v5 from brokers only; InitProducerId
    # v6 is KIP-939's two-phase commit. WriteTxnMarkers: broker to broker, and Kafka's tools.
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 5),
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.WRITE_TXN_MARKERS: (1, 2),  # broker to broker (and Kafka's tools); issue 16; v2: KIP-1228
    # Security (issue 18): ACLs and client quotas
    ApiKey.DESCRIBE_ACLS: (1, 3),
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    # Security (docs/security.md "Versions"); SaslHandshake never above v1 (KAFKA-9577)
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    # kafka-features (KIP-584): transaction.version, share.version
    ApiKey.UPDATE_FEATURES: (0, 2),
    # Share groups (KIP-932; docs/share-groups.md), at the versions Kafka 4.2 serves (v0 was 4.0's
    # early access, removed in 4.1); librdkafka 2.16 sends v1 of each. Advertised only while the
    # `share.version` feature is finalized at 1 or more (SHARE_APIS).
    ApiKey.SHARE_GROUP_HEARTBEAT: (1, 1),
    ApiKey.SHARE_GROUP_DESCRIBE: (1, 1),
    ApiKey.SHARE_FETCH: (1, 2),          # v2: BatchSize, ShareAcquireMode (KIP-1206), IsRenewAck (KIP-1222)
    ApiKey.SHARE_ACKNOWLEDGE: (1, 2),    # v2: IsRenewAck
    # the share groups' admin APIs (kafka-share-groups.sh --describe --offsets, --reset-offsets,
    # --delete-offsets); DescribeShareGroupOffsets v1: each share-partition's lag (KIP-1226, 4.2)
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1),
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: (0, 0),
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: (0, 0),
}

# APIs that ApiVersions lists (and the broker serves) only while share groups are enabled
SHARE_APIS = frozenset({ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_GROUP_DESCRIBE, ApiKey.SHARE_FETCH,
                        ApiKey.SHARE_ACKNOWLEDGE, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS,
                        ApiKey.ALTER_SHARE_GROUP_OFFSETS, ApiKey.DELETE_SHARE_GROUP_OFFSETS})

# Security (issue 18, docs/security.md "Versions"): what client listeners will advertise once the
# handlers exist; not in BROKER_VERSIONS until then. ACL APIs start at v1 (Kafka 4 removed v0, and
# kio has no v0); SaslHandshake never above v1 (KAFKA-9577).
SECURITY_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_ACLS: (1, 3),
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}

# oncelog-internal, on the controller listener only, never advertised: brokers follow the
# controller's security records (controller/security.py; JSON request and answer bodies)
SECURITY_RECORDS_KEY = 10000

# (min, max) served on the controller listener
CONTROLLER_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.SASL_HANDSHAKE: (1, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.BROKER_REGISTRATION: (0, 1),
    ApiKey.BROKER_HEARTBEAT: (0, 0),
    ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
    ApiKey.METADATA: (12, 12),
    ApiKey.CREATE_TOPICS: (7, 7),
    ApiKey.DELETE_TOPICS: (6, 6),
    ApiKey.CREATE_PARTITIONS: (3, 3),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (1, 1),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.CREATE_ACLS: (3, 3),
    ApiKey.DELETE_ACLS: (3, 3),
    ApiKey.ALTER_CLIENT_QUOTAS: (1, 1),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.UPDATE_FEATURES: (1, 1),
}

# first version using flexible encoding (request header v2, response header v1, compact types)
FIRST_FLEXIBLE: dict[int, int] = {
    ApiKey.PRODUCE: 9, ApiKey.FETCH: 12, ApiKey.LIST_OFFSETS: 6, ApiKey.METADATA: 9,
    ApiKey.OFFSET_COMMIT: 8, ApiKey.OFFSET_FETCH: 6, ApiKey.FIND_COORDINATOR: 3,
    ApiKey.JOIN_GROUP: 6, ApiKey.HEARTBEAT: 4, ApiKey.LEAVE_GROUP: 4, ApiKey.SYNC_GROUP: 4,
    ApiKey.DESCRIBE_GROUPS: 5, ApiKey.LIST_GROUPS: 3, ApiKey.DELETE_GROUPS: 2,
    ApiKey.API_VERSIONS: 3, ApiKey.CREATE_TOPICS: 5, ApiKey.DELETE_TOPICS: 4,
    ApiKey.DELETE_RECORDS: 2, ApiKey.INIT_PRODUCER_ID: 2, ApiKey.DESCRIBE_CONFIGS: 4,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: 1, ApiKey.DESCRIBE_CLUSTER: 0,
    ApiKey.ALTER_CONFIGS: 2, ApiKey.CREATE_PARTITIONS: 2, ApiKey.OFFSET_DELETE: 1 << 15, ApiKey.DESCRIBE_PRODUCERS: 0,
    ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.ADD_OFFSETS_TO_TXN: 3, ApiKey.END_TXN: 3,
    ApiKey.WRITE_TXN_MARKERS: 1, ApiKey.TXN_OFFSET_COMMIT: 3, ApiKey.DESCRIBE_TRANSACTIONS: 0,
    ApiKey.LIST_TRANSACTIONS: 0, ApiKey.CONSUMER_GROUP_HEARTBEAT: 0, ApiKey.CONSUMER_GROUP_DESCRIBE: 0,
    ApiKey.DESCRIBE_ACLS: 2, ApiKey.CREATE_ACLS: 2, ApiKey.DELETE_ACLS: 2, ApiKey.DESCRIBE_CLIENT_QUOTAS: 1,
    ApiKey.ALTER_CLIENT_QUOTAS: 1, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: 0,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: 0,
    ApiKey.SASL_HANDSHAKE: 1 << 15, ApiKey.SASL_AUTHENTICATE: 2, ApiKey.ALTER_PARTITION_REASSIGNMENTS: 0,
    ApiKey.BROKER_REGISTRATION: 0, ApiKey.BROKER_HEARTBEAT: 0, ApiKey.ALLOCATE_PRODUCER_IDS: 0,
    ApiKey.UPDATE_FEATURES: 0, ApiKey.DESCRIBE_LOG_DIRS: 2,
    ApiKey.SHARE_GROUP_HEARTBEAT: 0, ApiKey.SHARE_GROUP_DESCRIBE: 0, ApiKey.SHARE_FETCH: 0,
    ApiKey.SHARE_ACKNOWLEDGE: 0, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: 0, ApiKey.ALTER_SHARE_GROUP_OFFSETS: 0,
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: 0,
}

# kio's package name per API (kio.schema.<name>.v<N>.request / .response)
KIO_NAMES: dict[int, str] = {
    ApiKey.PRODUCE: "produce", ApiKey.FETCH: "fetch", ApiKey.LIST_OFFSETS: "list_offsets",
    ApiKey.METADATA: "metadata", ApiKey.API_VERSIONS: "api_versions",
    ApiKey.OFFSET_COMMIT: "offset_commit", ApiKey.OFFSET_FETCH: "offset_fetch",
    ApiKey.FIND_COORDINATOR: "find_coordinator", ApiKey.JOIN_GROUP: "join_group",
    ApiKey.HEARTBEAT: "heartbeat", ApiKey.LEAVE_GROUP: "leave_group", ApiKey.SYNC_GROUP: "sync_group",
    ApiKey.DESCRIBE_GROUPS: "describe_groups", ApiKey.LIST_GROUPS: "list_groups",
    ApiKey.DELETE_GROUPS: "delete_groups",
    ApiKey.CREATE_TOPICS: "create_topics", ApiKey.DELETE_TOPICS: "delete_topics",
    ApiKey.DELETE_RECORDS: "delete_records", ApiKey.INIT_PRODUCER_ID: "init_producer_id",
    ApiKey.DESCRIBE_CONFIGS: "describe_configs", ApiKey.ALTER_CONFIGS: "alter_configs",
    ApiKey.CREATE_PARTITIONS: "create_partitions", ApiKey.OFFSET_DELETE: "offset_delete",
    ApiKey.DESCRIBE_LOG_DIRS: "describe_log_dirs",
    ApiKey.INCREMENTAL_ALTER_CONFIGS: "incremental_alter_configs",
    ApiKey.DESCRIBE_CLUSTER: "describe_cluster", ApiKey.DESCRIBE_PRODUCERS: "describe_producers",
    ApiKey.ADD_PARTITIONS_TO_TXN: "add_partitions_to_txn", ApiKey.ADD_OFFSETS_TO_TXN: "add_offsets_to_txn",
    ApiKey.END_TXN: "end_txn", ApiKey.WRITE_TXN_MARKERS: "write_txn_markers",
    ApiKey.TXN_OFFSET_COMMIT: "txn_offset_commit", ApiKey.DESCRIBE_TRANSACTIONS: "describe_transactions",
    ApiKey.LIST_TRANSACTIONS: "list_transactions",
    ApiKey.CONSUMER_GROUP_HEARTBEAT: "consumer_group_heartbeat",
    ApiKey.CONSUMER_GROUP_DESCRIBE: "consumer_group_describe",
    ApiKey.DESCRIBE_ACLS: "describe_acls", ApiKey.CREATE_ACLS: "create_acls", ApiKey.DELETE_ACLS: "delete_acls",
    ApiKey.DESCRIBE_CLIENT_QUOTAS: "describe_client_quotas", ApiKey.ALTER_CLIENT_QUOTAS: "alter_client_quotas",
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: "describe_user_scram_credentials",
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: "alter_user_scram_credentials",
    ApiKey.SASL_HANDSHAKE: "sasl_handshake", ApiKey.SASL_AUTHENTICATE: "sasl_authenticate",
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: "alter_partition_reassignments",
    ApiKey.BROKER_REGISTRATION: "broker_registration", ApiKey.BROKER_HEARTBEAT: "broker_heartbeat",
    ApiKey.ALLOCATE_PRODUCER_IDS: "allocate_producer_ids", ApiKey.UPDATE_FEATURES: "update_features",
    ApiKey.SHARE_GROUP_HEARTBEAT: "share_group_heartbeat", ApiKey.SHARE_GROUP_DESCRIBE: "share_group_describe",
    ApiKey.SHARE_FETCH: "share_fetch", ApiKey.SHARE_ACKNOWLEDGE: "share_acknowledge",
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: "describe_share_group_offsets",
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: "alter_share_group_offsets",
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: "delete_share_group_offsets",
}


def is_flexible(api_key: int, version: int) -> bool:
    return version >= FIRST_FLEXIBLE.get(api_key, 1 << 15)


def api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return KIO_NAMES.get(api_key, f"api_{api_key}")


def kafka_api_name(api_key: int) -> str:
    """Kafka's own name of an API, as its JMX metrics label requests (`request=Produce`,
    `InitProducerId`): the key's words capitalized and joined."""
    try:
        return "".join(part.capitalize() for part in ApiKey(api_key).name.split("_"))
    except ValueError:
        return KIO_NAMES.get(api_key, f"api_{api_key}")
