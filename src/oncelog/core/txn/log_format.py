"""Records of `__transaction_state`: Kafka's TransactionLogKey/TransactionLogValue, byte for byte.

key:   int16 version (0), then TransactionalId as a STRING (int16 length).
value: int16 version, then TransactionLogValue. Version 1 (flexible, what we write):
         ProducerId i64, ProducerEpoch i16, TransactionTimeoutMs i32, TransactionStatus i8,
         TransactionPartitions COMPACT_NULLABLE_ARRAY[Topic COMPACT_STRING,
                                                       PartitionIds COMPACT_ARRAY[i32], tags],
         TransactionLastUpdateTimestampMs i64, TransactionStartTimestampMs i64, tags:
           0 PreviousProducerId i64 (default -1)   1 NextProducerId i64 (-1; Transactions V2)
           2 ClientTransactionVersion i16 (0)      10000 LastProducerEpoch i16 (oncelog's, -1)
           10001 OngoingTxnProducerEpoch i16 (oncelog's, -1; KIP-939: the epoch an Ongoing
                 two-phase-commit transaction was prepared at, once a KeepPreparedTxn bumped it)
       Version 0 is the same without tags and with classic (int16/int32-length) strings and arrays.
       A null value is a tombstone: the transactional id expired.

Kafka does not persist the last epoch, so a KIP-360 retry fails after a coordinator move; oncelog
keeps it in a tag of its own, which Kafka's readers skip. Integrity (CRC-32C) and torn tails are
the record batch's business, as for every partition.
"""
from __future__ import annotations

import struct

from oncelog.core.producer_epoch import MAX_EPOCH
from oncelog.core.topic_names import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from oncelog.core.txn.state import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    PERSISTED,
    PREPARED,
    TV_0,
    TopicPartition,
    TransactionMetadata,
    TxnState,
)
from oncelog.protocol.primitives import I16, I32, I64, Reader, array_len, string, tagged_fields

KEY_VERSION = 0
VALUE_VERSION = 1
TAG_PREVIOUS_PRODUCER_ID = 0
TAG_NEXT_PRODUCER_ID = 1
TAG_CLIENT_TRANSACTION_VERSION = 2
TAG_LAST_PRODUCER_EPOCH = 10000
TAG_ONGOING_TXN_EPOCH = 10001
_I8 = struct.Struct(">b")
_INT_MIN = -2**31


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode`: 31*h + c over UTF-16 code units, as a signed int32."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


def kafka_abs(n: int) -> int:
    """Kafka's `Utils.abs`: abs(Integer.MIN_VALUE) is 0, not negative."""
    return 0 if n == _INT_MIN else abs(n)


def partition_for(key: str, partitions: int) -> int:
    """The partition of `__transaction_state` (or `__consumer_offsets`) that owns `key`."""
    return kafka_abs(java_string_hash(key)) % partitions


def encode_key(transactional_id: str) -> bytes:
    return I16.pack(KEY_VERSION) + string(transactional_id, compact=False)


def decode_key(key: bytes) -> str:
    """The transactional id of a record key; ValueError for an unknown version or bad bytes."""
    try:
        r = Reader(key)
        version = r.i16()
        if version != KEY_VERSION:
            raise ValueError(f"unknown __transaction_state key version {version}")
        tid = r.string(compact=False)
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed __transaction_state key: {e}") from None
    if tid is None or r.pos != len(key):
        raise ValueError("malformed __transaction_state key: null id or trailing bytes")
    return tid


def _partitions_by_topic(partitions: frozenset[TopicPartition]) -> list[tuple[str, list[int]]]:
    topics: dict[str, list[int]] = {}
    for topic, index in partitions:
        topics.setdefault(topic, []).append(index)
    return [(t, sorted(p)) for t, p in sorted(topics.items())]


def encode_value(meta: TransactionMetadata) -> bytes:
    if meta.state not in PERSISTED:
        raise ValueError(f"state {meta.state.display_name} is never written")
    if meta.state == TxnState.EMPTY and meta.partitions:
        raise ValueError("an Empty transaction has no partitions")
    out = [I16.pack(VALUE_VERSION), I64.pack(meta.producer_id), I16.pack(meta.producer_epoch),
           I32.pack(meta.timeout_ms), _I8.pack(int(meta.state))]
    if meta.state == TxnState.EMPTY:
        out.append(array_len(None, compact=True))
    else:
        topics = _partitions_by_topic(meta.partitions)
        out.append(array_len(len(topics), compact=True))
        for topic, indexes in topics:
            out.append(string(topic, compact=True))
            out.append(array_len(len(indexes), compact=True))
            out.extend(I32.pack(i) for i in indexes)
            out.append(tagged_fields(None))
    out.append(I64.pack(meta.update_ms))
    out.append(I64.pack(meta.start_ms))
    tags: dict[int, bytes] = {}
    if meta.last_producer_id != NO_PRODUCER_ID:
        tags[TAG_PREVIOUS_PRODUCER_ID] = I64.pack(meta.last_producer_id)
    if meta.next_producer_id != NO_PRODUCER_ID:
        tags[TAG_NEXT_PRODUCER_ID] = I64.pack(meta.next_producer_id)
    if meta.client_transaction_version != TV_0:
        tags[TAG_CLIENT_TRANSACTION_VERSION] = I16.pack(meta.client_transaction_version)
    if meta.last_producer_epoch != NO_PRODUCER_EPOCH:
        tags[TAG_LAST_PRODUCER_EPOCH] = I16.pack(meta.last_producer_epoch)
    if meta.ongoing_txn_epoch != NO_PRODUCER_EPOCH:
        tags[TAG_ONGOING_TXN_EPOCH] = I16.pack(meta.ongoing_txn_epoch)
    out.append(tagged_fields(tags))
    return b"".join(out)


def decode_value(transactional_id: str, value: bytes | None) -> TransactionMetadata | None:
    """The metadata a record holds, None for a tombstone; ValueError for anything not written by a
    coordinator (unknown version, a state outside 0-7 or never written, bad ids, trailing bytes)."""
    if value is None:
        return None
    try:
        meta = _decode_value(transactional_id, value)
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed __transaction_state value for {transactional_id!r}: {e}") from None
    if meta.producer_id < 0 or not 0 <= meta.producer_epoch <= MAX_EPOCH:
        raise ValueError(f"bad producer id/epoch {meta.producer_id}/{meta.producer_epoch} "
                         f"for {transactional_id!r}")
    return meta


def _decode_value(transactional_id: str, value: bytes) -> TransactionMetadata:
    r = Reader(value)
    version = r.i16()
    if version not in (0, 1):
        raise ValueError(f"unknown __transaction_state value version {version}")
    flexible = version >= 1
    pid, epoch, timeout, status = r.i64(), r.i16(), r.i32(), r.i8()
    if status not in range(8) or TxnState(status) not in PERSISTED:
        raise ValueError(f"transaction state {status} is never written")
    state = TxnState(status)
    partitions: set[TopicPartition] = set()
    n = r.array_len(flexible)
    for _ in range(max(n, 0)):
        topic = r.string(flexible)
        count = r.array_len(flexible)
        if topic is None or count < 0:
            raise ValueError("null topic or partition list")
        for _ in range(count):
            partitions.add((topic, r.i32()))
        if flexible:
            r.skip_tags()
    update_ms, start_ms = r.i64(), r.i64()
    last_pid, last_epoch, next_pid, client_version = NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TV_0
    ongoing_epoch = NO_PRODUCER_EPOCH
    if flexible:
        tags = r.tags()
        if TAG_PREVIOUS_PRODUCER_ID in tags:
            last_pid = I64.unpack(bytes(tags[TAG_PREVIOUS_PRODUCER_ID]))[0]
        if TAG_NEXT_PRODUCER_ID in tags:
            next_pid = I64.unpack(bytes(tags[TAG_NEXT_PRODUCER_ID]))[0]
        if TAG_CLIENT_TRANSACTION_VERSION in tags:
            client_version = I16.unpack(bytes(tags[TAG_CLIENT_TRANSACTION_VERSION]))[0]
        if TAG_LAST_PRODUCER_EPOCH in tags:
            last_epoch = I16.unpack(bytes(tags[TAG_LAST_PRODUCER_EPOCH]))[0]
        if TAG_ONGOING_TXN_EPOCH in tags:
            ongoing_epoch = I16.unpack(bytes(tags[TAG_ONGOING_TXN_EPOCH]))[0]
    if r.pos != len(value):
        raise ValueError(f"{len(value) - r.pos} trailing bytes")
    if state == TxnState.EMPTY:
        partitions.clear()  # Kafka ignores them too
    if next_pid != NO_PRODUCER_ID and (next_pid < 0 or state not in PREPARED):
        raise ValueError(f"next producer id {next_pid} in state {state.display_name}")
    if ongoing_epoch != NO_PRODUCER_EPOCH and (state != TxnState.ONGOING or not 0 <= ongoing_epoch < epoch):
        raise ValueError(f"ongoing transaction epoch {ongoing_epoch} in state {state.display_name} at epoch {epoch}")
    return TransactionMetadata(transactional_id, pid, epoch, timeout, state, frozenset(partitions),
                               start_ms, update_ms, last_pid, last_epoch, next_pid, client_version,
                               ongoing_epoch)


def encode_record(transactional_id: str, meta: TransactionMetadata | None) -> tuple[bytes, bytes | None]:
    """(key, value) of the record that makes `meta` durable; `None` writes a tombstone."""
    return encode_key(transactional_id), None if meta is None else encode_value(meta)


__all__ = ["java_string_hash", "kafka_abs", "partition_for", "encode_key", "decode_key",
           "encode_value", "decode_value", "encode_record", "TRANSACTION_STATE_TOPIC",
           "CONSUMER_OFFSETS_TOPIC"]
