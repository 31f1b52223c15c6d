"""Raw requests for the attack tests: what an attacker sends where a client library would refuse
or hide it, over a plain socket to a real broker (or controller), and the broker log lines the
refusals leave."""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncelog.protocol import entities
from oncelog.protocol import produce as produce_wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.records.decode import iter_record_batches
from oncelog.testing.raw_client import RawConnection


def call(bootstrap: str, api_key: int, version: int, **fields) -> Any:
    """One request made from `fields`, its decoded answer."""
    with RawConnection(bootstrap) as c:
        return c.call(api_key, version, **fields)


def produce(bootstrap: str, topic: str, partition: int, records: bytes,
            version: int = 9) -> produce_wire.PartitionResponse:
    """A Produce (acks=all) of `records` to one partition; that partition's answer."""
    body = produce_wire.encode_request(version, -1, 10000, {topic: [(partition, records)]})
    with RawConnection(bootstrap) as c:
        answer = c.exchange(ApiKey.PRODUCE, version, body)
    return produce_wire.decode_response(version, answer)[0].partitions[0]


def fetch_records(bootstrap: str, topic: str, partition: int) -> tuple[int, list[tuple[bytes | None, bytes | None]]]:
    """(high watermark, [(key, value)] of its data records), read_uncommitted from offset 0."""
    fp = entities.nested(ApiKey.FETCH, 11, "request", "FetchPartition")
    ft = entities.nested(ApiKey.FETCH, 11, "request", "FetchTopic")
    r = call(bootstrap, ApiKey.FETCH, 11, max_wait=0, min_bytes=0, max_bytes=1 << 24, isolation_level=0,
             topics=(ft(topic=topic, partitions=(fp(partition=partition, fetch_offset=0,
                                                   partition_max_bytes=1 << 24),)),),
             forgotten_topics_data=())
    p = r.responses[0].partitions[0]
    assert p.error_code.value == 0, p
    out = []
    for header, batch in iter_record_batches(bytes(p.records or b"")):
        if not header.is_control:
            out.extend((rec.key, rec.value) for rec in batch)
    return int(p.high_watermark), out


def eventually(check: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
    """Poll `check` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout_s} s")
        time.sleep(0.05)


def wait_for_log(log_file: Path, pattern: str, timeout_s: float = 20) -> str:
    """The first line of `log_file` matching `pattern` (waits for it to be written)."""
    found = eventually(lambda: re.search(pattern, log_file.read_text(errors="replace")),
                       f"logged: {pattern!r}", timeout_s)
    return found.group(0)
