"""How long a broker paused past its session timeout keeps its partitions and groups from clients.

    .venv/bin/python bench/pause_failover.py [--rounds 5] [--pause 8]

A controller (broker session timeout 2 s, `testing.embedded.SESSION_TIMEOUT_MS`) and two broker
processes. Broker 2 leads partition 1 of a topic and the `__consumer_offsets` partition of a
group. Each round SIGSTOPs broker 2 for --pause seconds (past the session) and measures, from the
SIGSTOP, when broker 1 first accepts (a) a Produce to partition 1 (acks=all, so fsynced) and (b)
an OffsetCommit to the group after FindCoordinator names it, asking every 20 ms as a client that
refreshes its metadata would; then SIGCONTs broker 2, checks it serves neither, and moves both back
for the next round. Ownership is a fenced lease (docs/cluster.md): the new owner never waits for
the paused one, so both figures are the session timeout plus the time to notice and take over.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC, partition_for
from oncelog.protocol import entities, headers
from oncelog.protocol import produce as wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.cluster import LocalCluster
from oncelog.testing.embedded import SESSION_TIMEOUT_MS
from oncelog.testing.raw_client import RawConnection

TOPIC, GROUP, STEP_S = "failover", "failover-group", 0.02


def call(address: str, api: int, version: int, **fields):
    with RawConnection(address, timeout_s=1) as c:
        return c.call(api, version, **fields)


def leaders(address: str) -> dict[str, list[int]]:
    r = call(address, ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
             include_topic_authorized_operations=False)
    return {str(t.name): [int(p.leader_id) for p in sorted(t.partitions, key=lambda p: int(p.partition_index))]
            for t in r.topics}


def produce(address: str) -> int:
    batch = bytes(encode_batch([Record(0, int(time.time() * 1000), None, b"x", [])]))
    body = wire.encode_request(9, -1, 1000, {TOPIC: [(1, batch)]})
    with RawConnection(address, timeout_s=2) as c:
        c.send(ApiKey.PRODUCE, 9, body)
        frame = c.recv_frame()
    (t,) = wire.decode_response(9, frame, headers.response_header_size(ApiKey.PRODUCE, 9, frame))
    return t.partitions[0].error_code


def commit(address: str) -> int:
    t = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
    p = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
    r = call(address, ApiKey.OFFSET_COMMIT, 8, group_id=GROUP, generation_id_or_member_epoch=-1, member_id="",
             group_instance_id=None, topics=(t(name=TOPIC, partitions=(p(partition_index=0, committed_offset=1,
                                                                          committed_leader_epoch=-1,
                                                                          committed_metadata=""),)),))
    return int(r.topics[0].partitions[0].error_code.value)


def coordinator(address: str) -> int:
    r = call(address, ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=(GROUP,))
    c = r.coordinators[0]
    return int(c.node_id) if c.error_code.value == E.NONE else -1


def until(check, timeout_s: float = 60) -> float:
    """Seconds until check() first holds (asked every STEP_S)."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except (OSError, ConnectionError, ValueError):
            pass
        if time.monotonic() - start > timeout_s:
            raise TimeoutError("never")
        time.sleep(STEP_S)


def place(cluster: LocalCluster, b1: str) -> None:
    """Partition 1 and the group's offsets partition on broker 2."""
    n = partition_for(GROUP, 50)
    until(lambda: cluster.move_leader(TOPIC, 1, 2) == 0 and cluster.move_leader(CONSUMER_OFFSETS_TOPIC, n, 2) == 0)
    until(lambda: leaders(b1)[TOPIC][1] == 2 and coordinator(b1) == 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pause", type=float, default=8.0)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="oncelog-pause-failover-")
    cluster = LocalCluster(root, 2, proxies=False).start()
    b1, b2 = cluster.brokers[1].bootstrap, cluster.brokers[2].bootstrap
    served_p, served_g = [], []
    try:
        r = call(b1, ApiKey.CREATE_TOPICS, 7, topics=(entities.make(
            entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic"), name=TOPIC, num_partitions=2,
            replication_factor=1, assignments=(), configs=()),), timeout=30000, validate_only=False)
        assert r.topics[0].error_code.value == E.NONE
        until(lambda: coordinator(b1) >= 0)   # creates __consumer_offsets
        for i in range(args.rounds):
            place(cluster, b1)
            until(lambda: produce(b2) == E.NONE and commit(b2) == E.NONE)   # broker 2's view caught up
            cluster.pause_broker(2)
            started = time.monotonic()
            try:
                tp = until(lambda: leaders(b1)[TOPIC][1] == 1 and produce(b1) == E.NONE)
                tg = time.monotonic() - started
                tg += until(lambda: coordinator(b1) == 1 and commit(b1) == E.NONE)
                left = args.pause - (time.monotonic() - started)
                if left > 0:
                    time.sleep(left)
            finally:
                cluster.resume_broker(2)
            stale = (produce(b2), commit(b2))
            served_p.append(tp)
            served_g.append(max(tg, tp))
            print(f"round {i + 1}: partition served by broker 1 after {tp:.2f}s, group after {served_g[-1]:.2f}s; "
                  f"the resumed broker 2 answered {E(stale[0]).name} / {E(stale[1]).name}", flush=True)
    finally:
        cluster.stop()
    session = SESSION_TIMEOUT_MS / 1000
    for what, xs in (("partition", served_p), ("group", served_g)):
        print(f"{what}: median {statistics.median(xs):.2f}s, max {max(xs):.2f}s after the SIGSTOP "
              f"(session timeout {session:.0f}s: + {statistics.median(xs) - session:.2f}s median)")


if __name__ == "__main__":
    main()
