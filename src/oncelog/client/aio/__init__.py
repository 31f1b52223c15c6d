"""The asyncio client: same names as `oncelog.client`, with `await`."""
from oncelog.client.aio.admin import AIOAdminClient as AdminClient
from oncelog.client.aio.consumer import AIOConsumer as Consumer
from oncelog.client.aio.producer import AIOProducer as Producer
from oncelog.client.types import RecordMetadata, SentBatch

__all__ = ["Producer", "Consumer", "AdminClient", "RecordMetadata", "SentBatch"]
