"""One module per Kafka API; each has `API_KEY` and `handle(broker, version, body) -> bytes | None`
(a coroutine where it waits: Fetch long polls, InitProducerId may ask the controller, JoinGroup and
SyncGroup wait for the rebalance)."""
from oncelog.broker.handlers import (
                                     api_versions,
                                     create_topics,
                                     delete_groups,
                                     delete_records,
                                     delete_topics,
                                     describe_cluster,
                                     describe_configs,
                                     describe_groups,
                                     describe_producers,
                                     fetch,
                                     find_coordinator,
                                     heartbeat,
                                     incremental_alter_configs,
                                     init_producer_id,
                                     join_group,
                                     leave_group,
                                     list_groups,
                                     list_offsets,
                                     metadata,
                                     offset_commit,
                                     offset_fetch,
                                     produce,
                                     sync_group,
)

HANDLERS = {int(m.API_KEY): m for m in (
    api_versions, create_topics, delete_groups, delete_records, delete_topics, describe_cluster,
    describe_configs,
    describe_groups, describe_producers, fetch, find_coordinator, heartbeat, incremental_alter_configs,
    init_producer_id, join_group, leave_group, list_groups, list_offsets, metadata, offset_commit,
    offset_fetch, produce, sync_group)}
