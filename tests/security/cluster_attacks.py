"""Raw requests an attacker sends where a client library would refuse to (the broker-only APIs),
for the attack tests of issue 25; each returns the error code that matters."""
from __future__ import annotations

import asyncio
import ssl

from oncelog.broker.cluster.controller_client import ControllerClient
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey


def client(address: str, user: str | None = None, password: str | None = None, mechanism: str = "PLAIN",
           tls: ssl.SSLContext | None = None) -> ControllerClient:
    """A raw connection to `address`; with `user`, a SASL login (`mechanism`) on the first request."""
    host, _, port = address.rpartition(":")
    return ControllerClient(host, int(port), user, password, client_id="attacker", ssl_context=tls,
                            mechanism=mechanism)


async def write_marker(c: ControllerClient, topic: str, partition: int, producer_id: int, producer_epoch: int,
                       coordinator_epoch: int = 0, commit: bool = False) -> int:
    """WriteTxnMarkers v1 for one partition: its error code."""
    mod = entities.module(ApiKey.WRITE_TXN_MARKERS, 1, "request")
    r = await c.request(ApiKey.WRITE_TXN_MARKERS, 1, markers=(entities.make(
        mod.WritableTxnMarker, producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
        coordinator_epoch=coordinator_epoch, topics=(entities.make(
            mod.WritableTxnMarkerTopic, name=topic, partition_indexes=(partition,)),)),))
    return int(r.markers[0].topics[0].partitions[0].error_code)


async def verify_only(c: ControllerClient, transactional_id: str, producer_id: int, producer_epoch: int,
                      topic: str, partition: int) -> int:
    """AddPartitionsToTxn v4 with VerifyOnly (what a partition leader asks the coordinator): the
    request's error code."""
    mod = entities.module(ApiKey.ADD_PARTITIONS_TO_TXN, 4, "request")
    r = await c.request(ApiKey.ADD_PARTITIONS_TO_TXN, 4, transactions=(entities.make(
        mod.AddPartitionsToTxnTransaction, transactional_id=transactional_id, producer_id=producer_id,
        producer_epoch=producer_epoch, verify_only=True, topics=(entities.make(
            mod.AddPartitionsToTxnTopic, name=topic, partitions=(partition,)),)),))
    return int(r.error_code)


async def open_transaction(c: ControllerClient, topic: str, partition: int) -> tuple[int, int, int]:
    """(producer id, epoch, coordinator epoch) of the transaction open on the partition, from
    DescribeProducers: what anyone allowed to read the topic learns."""
    mod = entities.module(ApiKey.DESCRIBE_PRODUCERS, 0, "request")
    r = await c.request(ApiKey.DESCRIBE_PRODUCERS, 0, topics=(entities.make(
        mod.TopicRequest, name=topic, partition_indexes=(partition,)),))
    producers = [p for p in r.topics[0].partitions[0].active_producers if int(p.current_txn_start_offset) >= 0]
    assert producers, r
    p = producers[0]
    return int(p.producer_id), int(p.producer_epoch), int(p.coordinator_epoch)


def run(coro):
    return asyncio.run(coro)
