"""What a low-privilege principal can make the broker do through the transaction APIs (issue 36):
`mallory` has WRITE on transactional ids and on topics prefixed `mallory-`, READ on those topics
and on groups prefixed `mallory-`, and nothing else. Each phase is one way to push, measured as
the broker's RSS, `__transaction_state`'s bytes on disk, and another client's ApiVersions latency
(`bob`, one request every 10 ms on his own connection: p50, p99, max).

    .venv/bin/python bench/txn_flood.py [--ids 20000] [--partitions 2000] [--connections 4]
                                         [--repeat 2000] [--only init,describe,...] [--timers]
                                         [--baseline SRC]

Phases (`--only` picks some; names in the order they run):
- init: --ids InitProducerId v5 for distinct transactional ids, from --connections connections;
- init-long: 200 more, each id 32,000 characters long;
- add: one transaction adds all --partitions partitions of `mallory-big` in one AddPartitionsToTxn
  v3, then sends the same list again --repeat/10 times; another adds them one request each
  (at most 1,000); then one request names partition 0 --duplicates times;
- describe: one DescribeTransactions naming that transaction --repeat times;
- ongoing: --ongoing more transactions, each of every partition (the coordinator's memory per
  partition of an open transaction), then one DescribeTransactions naming them all;
- list: ListTransactions (every id the coordinator holds is decided on);
- end: EndTxn commit of the --partitions-partition transaction (its markers);
- offsets: AddOffsetsToTxn --repeat times for one group; TxnOffsetCommit of every partition with
  --metadata characters of metadata (32,000; offset.metadata.max.bytes is 4096), --repeat/100 times;
- 2pc: InitProducerId v6 Enable2Pc without TWO_PHASE_COMMIT (refused), then with it and
  KeepPreparedTxn --repeat times on one open transaction.

--timers instead: --ids transactions of one partition each (10 s timeout) are aborted by the
timeout sweep together ("timeouts"), then their ids expire together ("expiry",
transactional.id.expiration.ms set to 30 s).

--baseline SRC runs the same phases first against the broker of another source tree's src/."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from oncelog.protocol import entities  # noqa: E402
from oncelog.protocol.api import ApiKey  # noqa: E402
from oncelog.testing.embedded import BrokerProcess  # noqa: E402
from oncelog.testing.raw_client import RawConnection  # noqa: E402
from oncelog.testing.secure import jaas  # noqa: E402

USERS = {"admin": "admin-pw", "mallory": "mallory-pw", "bob": "bob-pw"}
TOPIC, GROUP, TXN, LITERAL, PREFIXED = 2, 3, 5, 3, 4
READ, WRITE, ALLOW, TWO_PHASE_COMMIT = 3, 4, 3, 15
TIMERS = {"transactional.id.expiration.ms": "30000",
          "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
          "transaction.remove.expired.transaction.cleanup.interval.ms": "1000"}
PHASES = ("init", "init-long", "add", "describe", "ongoing", "list", "end", "offsets", "2pc")
K = ApiKey


def login(address: str, user: str, timeout_s: float = 120) -> RawConnection:
    c = RawConnection(address, timeout_s=timeout_s)
    assert c.plain_login(user, USERS[user]) == 0
    return c


class Prober(threading.Thread):
    """bob's ApiVersions every 10 ms; latencies by phase."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.conn = login(address, "bob")
        self.phase: str | None = None
        self.samples: dict[str, list[float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            phase = self.phase
            t = time.perf_counter()
            self.conn.call(K.API_VERSIONS, 3, client_software_name="probe", client_software_version="1")
            took = time.perf_counter() - t
            if phase is not None:
                self.samples.setdefault(phase, []).append(took)
            time.sleep(0.01)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


class Run:
    def __init__(self, args, broker: BrokerProcess, data: Path) -> None:
        self.args, self.broker, self.data = args, broker, data
        self.address = f"127.0.0.1:{broker.listener_ports['SASL_PLAINTEXT']}"
        self.prober = Prober(self.address)
        self.out: dict[str, dict] = {}

    def rss(self) -> int:
        assert self.broker.proc is not None
        for line in Path(f"/proc/{self.broker.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def txn_log_bytes(self) -> int:
        return sum(f.stat().st_size for d in self.data.glob("__transaction_state-*") for f in d.glob("*.log"))

    def offsets_bytes(self) -> int:
        return sum(f.stat().st_size for f in (self.data / "__consumer_offsets").rglob("*") if f.is_file()) \
            if (self.data / "__consumer_offsets").exists() else 0

    def phase(self, name: str, work) -> None:
        rss0, log0, off0 = self.rss(), self.txn_log_bytes(), self.offsets_bytes()
        self.prober.phase = name
        t = time.perf_counter()
        extra = work() or {}
        wall = time.perf_counter() - t
        self.prober.phase = None
        probe = self.prober.samples.get(name, [])
        r = {"wall_s": wall, "rss_mb": (self.rss() - rss0) / 1e6, "txn_log_mb": (self.txn_log_bytes() - log0) / 1e6,
             "offsets_mb": (self.offsets_bytes() - off0) / 1e6,
             "probe_ms": (pct(probe, 0.5) * 1000, pct(probe, 0.99) * 1000, max(probe, default=0) * 1000, len(probe)),
             **extra}
        self.out[name] = r
        print(f"  {name:10s} {wall:7.2f} s  RSS {r['rss_mb']:+8.1f} MB  txn log {r['txn_log_mb']:+8.2f} MB  "
              f"offsets {r['offsets_mb']:+7.2f} MB  ApiVersions p50 {r['probe_ms'][0]:6.1f} "
              f"p99 {r['probe_ms'][1]:7.1f} max {r['probe_ms'][2]:7.1f} ms  {extra}", flush=True)

    # ------------------------------------------------------------------ phases
    def init_ids(self, prefix: str, n: int, pad: int = 0) -> dict:
        lock, counter, codes = threading.Lock(), [0], {}

        def work() -> None:
            c = login(self.address, "mallory")
            while True:
                with lock:
                    if counter[0] >= n:
                        break
                    i = counter[0]
                    counter[0] += 1
                tid = f"{prefix}{i}-" + "x" * pad
                r = c.call(K.INIT_PRODUCER_ID, 5, transactional_id=tid, transaction_timeout=60000,
                           producer_id=-1, producer_epoch=-1)
                with lock:
                    codes[int(r.error_code)] = codes.get(int(r.error_code), 0) + 1
            c.close()

        threads = [threading.Thread(target=work) for _ in range(self.args.connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"codes": codes}

    def init_one(self, c: RawConnection, tid: str, version: int = 5, **kw) -> tuple[int, int, int]:
        deadline = time.monotonic() + 60
        while True:   # the first transactional request creates __transaction_state: retriable codes meanwhile
            r = c.call(K.INIT_PRODUCER_ID, version, transactional_id=tid, transaction_timeout=60000,
                       producer_id=-1, producer_epoch=-1, **kw)
            if int(r.error_code) not in (14, 15, 51) or time.monotonic() > deadline:
                return int(r.error_code), int(r.producer_id), int(r.producer_epoch)
            time.sleep(0.05)

    def add(self, c: RawConnection, tid: str, pid: int, epoch: int, partitions) -> dict[int, int]:
        tp = entities.nested(K.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
        r = c.call(K.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                   v3_and_below_producer_epoch=epoch,
                   v3_and_below_topics=(tp(name="mallory-big", partitions=tuple(partitions)),))
        codes: dict[int, int] = {}
        for t in r.results_by_topic_v3_and_below:
            for p in t.results_by_partition:
                codes[int(p.partition_error_code)] = codes.get(int(p.partition_error_code), 0) + 1
        return codes

    def timers(self) -> dict:
        """--timers: --ids transactions (each of one partition, a 10 s timeout) time out together,
        then their ids expire together (transactional.id.expiration.ms 30 s)."""
        a = self.args
        self.prober.start()
        m = login(self.address, "mallory")
        lock, counter = threading.Lock(), [0]

        def work() -> None:
            c = login(self.address, "mallory")
            while True:
                with lock:
                    if counter[0] >= a.ids:
                        break
                    i = counter[0]
                    counter[0] += 1
                r = c.call(K.INIT_PRODUCER_ID, 5, transactional_id=f"mallory-t-{i}", transaction_timeout=10000,
                           producer_id=-1, producer_epoch=-1)
                if int(r.error_code) == 0:
                    self.add(c, f"mallory-t-{i}", int(r.producer_id), int(r.producer_epoch), (i % a.partitions,))
            c.close()

        threads = [threading.Thread(target=work) for _ in range(a.connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        def count(states: tuple[str, ...]) -> int:
            r = m.call(K.LIST_TRANSACTIONS, 1, state_filters=states, producer_id_filters=(), duration_filter=-1)
            return sum(1 for s in r.transaction_states if str(s.transactional_id).startswith("mallory-t-"))

        def until_none(states: tuple[str, ...]) -> dict:
            t, deadline = time.perf_counter(), time.monotonic() + 300
            while count(states) and time.monotonic() < deadline:
                time.sleep(0.5)
            return {"left": count(states), "after_s": round(time.perf_counter() - t, 1)}
        self.phase("timeouts", lambda: until_none(("Ongoing", "PrepareAbort")))
        self.phase("expiry", lambda: until_none(()))
        self.prober.stop.set()
        self.prober.join()
        return self.out

    def run(self) -> dict:
        a, only = self.args, set(self.args.only.split(",")) if self.args.only else set(PHASES)
        if a.timers:
            return self.timers()
        self.prober.start()
        m = login(self.address, "mallory")
        big: tuple[str, int, int] | None = None
        if "init" in only:
            self.phase("init", lambda: self.init_ids("mallory-i-", a.ids))
            self.out["init"]["per_id_rss_b"] = self.out["init"]["rss_mb"] * 1e6 / a.ids
            self.out["init"]["per_id_log_b"] = self.out["init"]["txn_log_mb"] * 1e6 / a.ids
        if "init-long" in only:
            self.phase("init-long", lambda: self.init_ids("mallory-l-", 200, pad=32000))
        if {"add", "describe", "end", "list"} & only:
            code, pid, epoch = self.init_one(m, "mallory-big-txn")
            assert code == 0, code
            big = ("mallory-big-txn", pid, epoch)

            def add_all() -> dict:
                t = time.perf_counter()
                first = self.add(m, *big, range(a.partitions))
                first_s = time.perf_counter() - t
                for _ in range(a.repeat // 10):
                    again = self.add(m, *big, range(a.partitions))
                return {"first_s": round(first_s, 3), "first": first, "again": again}
            self.phase("add", add_all)

            def add_one_by_one() -> dict:
                code, pid, epoch = self.init_one(m, "mallory-one-by-one")
                assert code == 0
                n = min(a.partitions, 1000)
                for i in range(n):
                    self.add(m, "mallory-one-by-one", pid, epoch, (i,))
                return {"adds": n}
            self.phase("add-1by1", add_one_by_one)

            def add_duplicates() -> dict:
                t = time.perf_counter()
                codes = self.add(m, *big, [0] * a.duplicates)
                return {"partitions": a.duplicates, "took_s": round(time.perf_counter() - t, 2), "codes": codes}
            self.phase("add-dups", add_duplicates)
        if "describe" in only and big is not None:
            def describe() -> dict:
                t = time.perf_counter()
                c = login(self.address, "mallory", timeout_s=600)
                c.send(K.DESCRIBE_TRANSACTIONS, 0, entities.encode(entities.make(
                    entities.entity_class(K.DESCRIBE_TRANSACTIONS, 0, "request"),
                    transactional_ids=(big[0],) * a.repeat)))
                frame = c.recv_frame()
                return {"answer_mb": round(len(frame) / 1e6, 1), "took_s": round(time.perf_counter() - t, 2)}
            self.phase("describe", describe)
        if "ongoing" in only:
            def ongoing() -> dict:
                t = time.perf_counter()
                for i in range(a.ongoing):
                    code, pid, epoch = self.init_one(m, f"mallory-o-{i}")
                    assert code == 0, code
                    assert self.add(m, f"mallory-o-{i}", pid, epoch, range(a.partitions)) == {0: a.partitions}
                return {"transactions": a.ongoing, "made_s": round(time.perf_counter() - t, 1)}
            self.phase("ongoing", ongoing)
            self.out["ongoing"]["per_partition_rss_b"] = round(
                self.out["ongoing"]["rss_mb"] * 1e6 / (a.ongoing * a.partitions), 1)

            def describe_many() -> dict:
                t = time.perf_counter()
                c = login(self.address, "mallory", timeout_s=600)
                c.send(K.DESCRIBE_TRANSACTIONS, 0, entities.encode(entities.make(
                    entities.entity_class(K.DESCRIBE_TRANSACTIONS, 0, "request"),
                    transactional_ids=tuple(f"mallory-o-{i}" for i in range(a.ongoing)))))
                frame = c.recv_frame()
                return {"answer_mb": round(len(frame) / 1e6, 1), "took_s": round(time.perf_counter() - t, 2)}
            self.phase("desc-many", describe_many)
        if "list" in only:
            def list_all() -> dict:
                took = []
                for _ in range(20):
                    t = time.perf_counter()
                    r = m.call(K.LIST_TRANSACTIONS, 1, state_filters=(), producer_id_filters=(), duration_filter=-1)
                    took.append(time.perf_counter() - t)
                return {"listed": len(r.transaction_states), "p50_ms": round(statistics.median(took) * 1000, 1)}
            self.phase("list", list_all)
        if "end" in only and big is not None:
            def end() -> dict:
                r = m.call(K.END_TXN, 4, transactional_id=big[0], producer_id=big[1], producer_epoch=big[2],
                           committed=True)
                # the markers run after the answer: wait until the transaction completes
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    d = m.call(K.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(big[0],))
                    if d.transaction_states[0].transaction_state == "CompleteCommit":
                        break
                    time.sleep(0.05)
                return {"code": int(r.error_code), "state": d.transaction_states[0].transaction_state}
            self.phase("end", end)
        if "offsets" in only:
            def offsets() -> dict:
                code, pid, epoch = self.init_one(m, "mallory-offsets")
                assert code == 0
                for _ in range(a.repeat):
                    r = m.call(K.ADD_OFFSETS_TO_TXN, 3, transactional_id="mallory-offsets", producer_id=pid,
                               producer_epoch=epoch, group_id="mallory-g")
                tp = entities.nested(K.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestTopic")
                pp = entities.nested(K.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestPartition")
                n = min(a.partitions, 2000)
                commit_codes: dict[int, int] = {}
                for _ in range(max(1, a.repeat // 100)):
                    rc = m.call(K.TXN_OFFSET_COMMIT, 3, transactional_id="mallory-offsets", group_id="mallory-g",
                                producer_id=pid, producer_epoch=epoch, generation_id=-1, member_id="",
                                group_instance_id=None, topics=(tp(name="mallory-big", partitions=tuple(
                                    pp(partition_index=i, committed_offset=0, committed_leader_epoch=-1,
                                       committed_metadata="m" * a.metadata) for i in range(n))),))
                    for t in rc.topics:
                        for p in t.partitions:
                            commit_codes[int(p.error_code)] = commit_codes.get(int(p.error_code), 0) + 1
                return {"add_offsets": int(r.error_code), "commit": commit_codes}
            self.phase("offsets", offsets)
        if "2pc" in only:
            def two_pc() -> dict:
                refused = self.init_one(m, "mallory-2pc", 6, enable2_pc=True)[0]
                admin = login(self.address, "admin")
                acl(admin, [(TXN, "mallory-2pc", LITERAL, TWO_PHASE_COMMIT)])
                time.sleep(1)   # the broker follows the controller's ACLs
                code, pid, epoch = self.init_one(m, "mallory-2pc", 6, enable2_pc=True)
                assert code == 0, code
                assert self.add(m, "mallory-2pc", pid, epoch, (0,)) == {0: 1}
                codes: dict[int, int] = {}
                for _ in range(a.repeat):
                    c = self.init_one(m, "mallory-2pc", 6, enable2_pc=True, keep_prepared_txn=True)[0]
                    codes[c] = codes.get(c, 0) + 1
                return {"without_right": refused, "keep_prepared": codes}
            self.phase("2pc", two_pc)
        self.prober.stop.set()
        self.prober.join()
        return self.out


def acl(admin: RawConnection, entries) -> None:
    a = entities.nested(K.CREATE_ACLS, 3, "request", "AclCreation")
    r = admin.call(K.CREATE_ACLS, 3, creations=tuple(
        a(resource_type=rtype, resource_name=name, resource_pattern_type=pattern, principal="User:mallory",
          host="*", operation=op, permission_type=ALLOW) for rtype, name, pattern, op in entries))
    assert all(int(x.error_code) == 0 for x in r.results), r


def flood(args, src: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-txn-") as d:
        env = {"PYTHONPATH": src} if src else {}
        data = Path(d) / "data"
        broker = BrokerProcess(data, {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas(USERS),
            "authorizer.class.name": "StandardAuthorizer", "super.users": "User:admin",
            "transaction.two.phase.commit.enable": "true", **(TIMERS if args.timers else {})}, env=env).start(120)
        try:
            address = f"127.0.0.1:{broker.listener_ports['SASL_PLAINTEXT']}"
            with login(address, "admin", timeout_s=600) as admin:
                ct = entities.nested(K.CREATE_TOPICS, 7, "request", "CreatableTopic")
                r = admin.call(K.CREATE_TOPICS, 7, topics=(ct(name="mallory-big", num_partitions=args.partitions,
                                                              replication_factor=1, assignments=(), configs=()),),
                               timeout=60000, validate_only=False)
                assert int(r.topics[0].error_code) == 0, r
                acl(admin, [(TXN, "mallory-", PREFIXED, WRITE), (TOPIC, "mallory-", PREFIXED, WRITE),
                            (TOPIC, "mallory-", PREFIXED, READ), (GROUP, "mallory-", PREFIXED, READ)])
                time.sleep(1)   # the broker follows the controller's ACLs
            return Run(args, broker, data).run()
        finally:
            broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", type=int, default=20000)
    ap.add_argument("--partitions", type=int, default=2000)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--ongoing", type=int, default=200, help="open transactions of every partition (ongoing)")
    ap.add_argument("--metadata", type=int, default=32000, help="characters of each offset's metadata (offsets)")
    ap.add_argument("--duplicates", type=int, default=500_000, help="one partition named this often in one add")
    ap.add_argument("--only", help="comma-separated phases: " + ",".join(PHASES))
    ap.add_argument("--timers", action="store_true", help="only: --ids transactions time out, then expire, together")
    ap.add_argument("--baseline", help="another source tree's src/ to run first")
    args = ap.parse_args()
    if args.baseline:
        print(f"baseline ({args.baseline}):", flush=True)
        flood(args, args.baseline)
    print("this tree:", flush=True)
    flood(args, None)


if __name__ == "__main__":
    main()
