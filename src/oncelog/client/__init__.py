"""oncelog's Kafka client: an idempotent producer with KIP-1269 in-flight windows, a consumer and
an admin client. Synchronous classes here; asyncio ones in `oncelog.client.aio`."""
from oncelog.client.aio.admin import NewTopic
from oncelog.client.aio.share_consumer import ACCEPT, REJECT, RELEASE, RENEW, ShareRecord
from oncelog.client.sync import AdminClient, Consumer, Producer, ShareConsumer
from oncelog.client.txn_core import PreparedTxnState
from oncelog.client.types import ConsumerRecord, RecordMetadata, SentBatch, TopicPartition

__all__ = ["Producer", "Consumer", "AdminClient", "RecordMetadata", "SentBatch", "ConsumerRecord",
           "TopicPartition", "NewTopic", "PreparedTxnState", "ShareConsumer", "ShareRecord", "ACCEPT", "RELEASE",
           "REJECT", "RENEW"]
