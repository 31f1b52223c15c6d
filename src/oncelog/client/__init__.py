"""oncelog's Kafka client: an idempotent producer with KIP-1269 in-flight windows, a consumer and
an admin client. Synchronous classes here; asyncio ones in `oncelog.client.aio`."""
from oncelog.client.accumulator import TopicPartition as _TP  # noqa: F401
from oncelog.client.aio.producer import RecordMetadata
from oncelog.client.sync import Producer

__all__ = ["Producer", "RecordMetadata"]
