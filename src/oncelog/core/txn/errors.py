"""Which error code each transactional request gets at each version: the one home of these rules.

Kafka's coordinator decides in today's codes; `KafkaApis` then rewrites a few for clients that
predate them. Handlers call `for_version` on whatever the coordinator or a partition decided and
never spell a mapping themselves.
"""
from __future__ import annotations

from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

E = ErrorCode

# First version that understands PRODUCER_FENCED (older ones get INVALID_PRODUCER_EPOCH).
_PRODUCER_FENCED_SINCE: dict[int, int] = {
    ApiKey.INIT_PRODUCER_ID: 4,
    ApiKey.ADD_PARTITIONS_TO_TXN: 2,
    ApiKey.ADD_OFFSETS_TO_TXN: 2,
    ApiKey.END_TXN: 2,
}
# First version that understands TRANSACTION_ABORTABLE (KIP-890); older ones get INVALID_TXN_STATE.
# Produce and TxnOffsetCommit see it from partition verification only.
_TRANSACTION_ABORTABLE_SINCE: dict[int, int] = {
    ApiKey.PRODUCE: 11,
    ApiKey.TXN_OFFSET_COMMIT: 4,
}


def for_version(api_key: int, version: int, code: int) -> int:
    """The code a client speaking `version` of `api_key` is answered with."""
    if code == E.PRODUCER_FENCED:
        since = _PRODUCER_FENCED_SINCE.get(api_key)
        if since is None:
            # Partitions (Produce, TxnOffsetCommit) always say INVALID_PRODUCER_EPOCH: clients
            # treat it there as abortable, while PRODUCER_FENCED would be fatal.
            return E.INVALID_PRODUCER_EPOCH if api_key in _TRANSACTION_ABORTABLE_SINCE else code
        return E.INVALID_PRODUCER_EPOCH if version < since else code
    if code == E.TRANSACTION_ABORTABLE:
        since = _TRANSACTION_ABORTABLE_SINCE.get(api_key)
        if since is not None and version < since:
            return E.INVALID_TXN_STATE
        return code
    if code == E.COORDINATOR_LOAD_IN_PROGRESS and api_key == ApiKey.TXN_OFFSET_COMMIT and version < 2:
        return E.COORDINATOR_NOT_AVAILABLE
    return code


def translate_append_error(code: int) -> int:
    """What a coordinator answers when appending to `__transaction_state` failed
    (`TransactionStateManager.appendTransactionToLog`)."""
    if code in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_ENOUGH_REPLICAS, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                E.REQUEST_TIMED_OUT):
        return E.COORDINATOR_NOT_AVAILABLE
    if code in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return E.NOT_COORDINATOR
    if code in (E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE):
        return E.UNKNOWN_SERVER_ERROR
    return code


def verification_error(code: int, api_key: int, version: int) -> int:
    """What a partition leader answers a transactional Produce/TxnOffsetCommit whose
    AddPartitionsToTxn VerifyOnly check came back with `code` (Kafka's AddPartitionsToTxnManager):
    a top-level CLUSTER_AUTHORIZATION_FAILED is not the client's business, PRODUCER_FENCED is told
    as INVALID_PRODUCER_EPOCH, TRANSACTION_ABORTABLE as INVALID_TXN_STATE to older versions."""
    if code == E.CLUSTER_AUTHORIZATION_FAILED:
        return E.INVALID_TXN_STATE
    return for_version(api_key, version, code)
