"""The fault proxy passes TLS through (SASL_SSL to a real broker), faulting per TLS record:
resets and dropped responses under an idempotent producer still give every record once."""
from __future__ import annotations

import time

import pytest

from oncelog.testing.embedded import free_port
from oncelog.testing.fault_proxy import TLS_RECORD, FaultConfig, ThreadedFaultProxy
from oncelog.testing.secure import SecureBroker

pytestmark = pytest.mark.processes


def test_sasl_ssl_through_the_fault_proxy_with_faults(tmp_path):
    from confluent_kafka import Consumer, Producer
    bport, pport = free_port(), free_port()
    b = SecureBroker(tmp_path, {"listeners": f"SASL_SSL://127.0.0.1:{bport},PLAINTEXT://127.0.0.1:0",
                                "advertised.listeners": f"SASL_SSL://127.0.0.1:{pport}"}).start()
    proxy = ThreadedFaultProxy(f"127.0.0.1:{bport}", FaultConfig(drop_response_probability=0.05,
                                                                 reset_probability=0.01, seed=7), port=pport).start()
    try:
        conf = {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(b.pki.ca), "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "admin", "sasl.password": "admin-secret"}
        p = Producer({**conf, "enable.idempotence": True, "linger.ms": 5, "batch.num.messages": 20})
        errors = []
        for i in range(400):
            p.produce("through-proxy", str(i).encode(), partition=0,
                      on_delivery=lambda err, msg: err and errors.append(err))
            if i % 50 == 0:
                p.poll(0)
        assert p.flush(120) == 0 and not errors
        stats = proxy.stats
        assert stats.requests[TLS_RECORD] > 0 and stats.dropped_responses + stats.resets > 0, stats
        proxy.proxy.enabled = False
        c = Consumer({**conf, "group.id": "through-proxy", "auto.offset.reset": "earliest"})
        c.subscribe(["through-proxy"])
        values, deadline = [], time.monotonic() + 60
        while len(values) < 400 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                values.append(int(m.value()))
        c.close()
        assert values == list(range(400))   # once each, in order
    finally:
        proxy.stop()
        b.stop()
