"""Who wrote the batch that holds an offset: its producer id, epoch and first sequence, read with a
raw Fetch from the partition's leader (PLAINTEXT). What the history checker needs to tell a broker
that appended a retry twice (one producer epoch, one sequence) from a client that sent the same
records again as new ones, under a new epoch: a new epoch starts a new sequence space, so no broker
can recognise those (`checker.reclassify_restamped`)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.records import iter_batches
from oncelog.testing.raw_client import RawConnection

FETCH_VERSION = 12


class BatchIdentity(NamedTuple):
    producer_id: int
    producer_epoch: int
    base_sequence: int
    base_offset: int


def batch_identities(bootstrap: str, topic: str, places: Iterable[tuple[int, int]],
                     timeout_s: float = 10) -> dict[tuple[int, int], BatchIdentity]:
    """(partition, offset) -> the identity of the batch holding it, for each place whose leader
    answered a batch there (a place below the log start, or whose leader is away, is left out)."""
    wanted = sorted(set(places))
    if not wanted:
        return {}
    md = _metadata(bootstrap, topic, timeout_s)
    brokers = {b.node_id: f"{b.host}:{b.port}" for b in md.brokers}
    leaders = {p.partition_index: p.leader_id for t_ in md.topics for p in t_.partitions}
    by_leader: dict[str, list[tuple[int, int]]] = {}
    for partition, offset in wanted:
        address = brokers.get(leaders.get(partition, -1))
        if address is not None:
            by_leader.setdefault(address, []).append((partition, offset))
    found: dict[tuple[int, int], BatchIdentity] = {}
    for address, at in by_leader.items():   # one connection per leader
        with RawConnection(address, timeout_s=timeout_s) as c:
            for partition, offset in at:
                for _pos, h in iter_batches(memoryview(_fetch(c, topic, partition, offset))):
                    if h.base_offset <= offset <= h.last_offset:
                        found[(partition, offset)] = BatchIdentity(h.producer_id, h.producer_epoch,
                                                                   h.base_sequence, h.base_offset)
                        break
    return found


def _metadata(bootstrap: str, topic: str, timeout_s: float):
    """Metadata for `topic` from the first of the bootstrap servers (comma-separated) that answers."""
    t = entities.nested(ApiKey.METADATA, 12, "request", "MetadataRequestTopic")
    error: OSError | None = None
    for address in bootstrap.split(","):
        try:
            with RawConnection(address.strip(), timeout_s=timeout_s) as c:
                return c.call(ApiKey.METADATA, 12, topics=(t(topic_id=None, name=topic),),
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        except OSError as e:
            error = e
    assert error is not None
    raise error


def _fetch(c: RawConnection, topic: str, partition: int, offset: int) -> bytes:
    rq = entities.RequestBuilder(ApiKey.FETCH, FETCH_VERSION)
    body = rq.encode(replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
                     session_epoch=-1, topics=(rq("FetchTopic", topic=topic, partitions=(rq(
                         "FetchPartition", partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                         last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)),),
                     forgotten_topics_data=(), rack_id="")
    answer = entities.decode_response(ApiKey.FETCH, FETCH_VERSION, c.exchange(ApiKey.FETCH, FETCH_VERSION, body))
    for t in answer.responses:
        for p in t.partitions:
            if p.partition_index == partition and p.records:
                return bytes(p.records)
    return b""
