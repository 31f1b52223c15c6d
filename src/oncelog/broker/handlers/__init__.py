"""One module per Kafka API; each has `API_KEY` and `handle(broker, version, body) -> bytes | None`
(a coroutine where it waits: Fetch long polls, InitProducerId may ask the controller)."""
from oncelog.broker.handlers import (api_versions, create_topics, delete_records, delete_topics,
                                     describe_cluster, describe_configs, describe_producers, fetch,
                                     incremental_alter_configs, init_producer_id, list_offsets,
                                     metadata, produce)

HANDLERS = {int(m.API_KEY): m for m in (
    api_versions, create_topics, delete_records, delete_topics, describe_cluster, describe_configs,
    describe_producers, fetch, incremental_alter_configs, init_producer_id, list_offsets, metadata,
    produce)}
