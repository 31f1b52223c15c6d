"""Produce throughput over SASL_SSL (SCRAM-SHA-512, TLS) against PLAINTEXT, same broker, same run:
librdkafka's idempotent producer (acks=all, 1 KB records, one partition) sends to one oncelog
broker whose listeners are PLAINTEXT and SASL_SSL (key material made with openssl in a temporary
directory). The runs alternate (PLAINTEXT, SASL_SSL, ...) so that drift hits both alike.

    .venv/bin/python bench/security.py [--records 50000] [--repeat 3]

Prints records/s and MB/s (best of --repeat) per listener and the ratio SASL_SSL / PLAINTEXT.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from broker_produce import VALUE, produce  # noqa: E402
from oncelog.testing.secure import SecureBroker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-security-") as d:
        b = SecureBroker(Path(d)).start()
        try:
            confs = {
                "PLAINTEXT": {"bootstrap.servers": b.address("PLAINTEXT")},
                "SASL_SSL": {"bootstrap.servers": b.address("SASL_SSL"), "security.protocol": "SASL_SSL",
                             "ssl.ca.location": str(b.pki.ca), "sasl.mechanism": "SCRAM-SHA-512",
                             "sasl.username": "admin", "sasl.password": "admin-secret"},
            }
            admin = AdminClient(confs["PLAINTEXT"])
            for f in admin.create_topics([NewTopic(f"bench-{n}", 1, 1) for n in confs]).values():
                f.result(30)
            best = {name: 0.0 for name in confs}
            for _ in range(args.repeat):
                for name, conf in confs.items():
                    best[name] = max(best[name], produce(conf, f"bench-{name}", args.records))
        finally:
            b.stop()
    for name, rate in best.items():
        print(f"{name:10s} {rate:10.0f} records/s  {rate * len(VALUE) / 1e6:7.1f} MB/s")
    print(f"SASL_SSL / PLAINTEXT: {best['SASL_SSL'] / best['PLAINTEXT']:.2f}")


if __name__ == "__main__":
    main()
