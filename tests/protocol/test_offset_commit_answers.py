"""OffsetCommitResponse and TxnOffsetCommitResponse written by hand (`protocol.offset_commit_answers`)
are byte for byte what kio writes, at every version served."""
from __future__ import annotations

import pytest

from oncelog.protocol import entities
from oncelog.protocol import offset_commit_answers as wire
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey
from oncelog.protocol.errors import ErrorCode as E

TOPICS = [("orders", [(i, E.NONE if i % 3 else E.TOPIC_AUTHORIZATION_FAILED) for i in range(2000)]),
          ("é" * 40, [(7, E.OFFSET_METADATA_TOO_LARGE), (3, E.UNKNOWN_TOPIC_OR_PARTITION)]), ("empty", [])]


def _kio(api: int, version: int, topic_cls: str, partition_cls: str) -> bytes:
    rb = entities.ResponseBuilder(api, version)
    return rb.encode(throttle_time=7, topics=tuple(
        rb(topic_cls, name=name, partitions=tuple(rb(partition_cls, partition_index=i, error_code=c) for i, c in ps))
        for name, ps in TOPICS))


@pytest.mark.parametrize("version", range(BROKER_VERSIONS[ApiKey.OFFSET_COMMIT][0],
                                          BROKER_VERSIONS[ApiKey.OFFSET_COMMIT][1] + 1))
def test_offset_commit_answers_are_kios(version):
    assert wire.offset_commit(version, TOPICS, 7) == _kio(ApiKey.OFFSET_COMMIT, version, "OffsetCommitResponseTopic",
                                                          "OffsetCommitResponsePartition")


@pytest.mark.parametrize("version", range(BROKER_VERSIONS[ApiKey.TXN_OFFSET_COMMIT][0],
                                          BROKER_VERSIONS[ApiKey.TXN_OFFSET_COMMIT][1] + 1))
def test_txn_offset_commit_answers_are_kios(version):
    assert wire.txn_offset_commit(version, TOPICS, 7) == _kio(
        ApiKey.TXN_OFFSET_COMMIT, version, "TxnOffsetCommitResponseTopic", "TxnOffsetCommitResponsePartition")
