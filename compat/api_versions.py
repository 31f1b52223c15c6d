#!/usr/bin/env python3
"""Prints the Markdown table of docs/compatibility.md: the Kafka APIs oncelog serves beside Kafka's.

oncelog's side is `oncelog.protocol.api` (BROKER_VERSIONS, and the versions the transaction and
security handlers will advertise when they land); Kafka's side is kio's schemas, generated from
Kafka's message definitions (clients/src/main/resources/common/message/*.json).

    PYTHONPATH=src python compat/api_versions.py > /tmp/table.md
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kio.schema.index import api_key_map, schema_name_map  # noqa: E402

from oncelog.protocol.api import (  # noqa: E402
    BROKER_VERSIONS,
    CONTROLLER_VERSIONS,
    SECURITY_VERSIONS,
    TRANSACTION_VERSIONS,
)

# Kafka's message definitions whose "listeners" name only the controller (KRaft quorum and
# broker-to-controller RPCs): no client sends them to a broker.
CONTROLLER_ONLY = {52, 53, 54, 56, 58, 59, 62, 63, 67, 70, 73, 80, 81, 82}
# Broker-to-broker (share coordinator state) RPCs, on the broker listener but not for clients.
INTER_BROKER = {83, 84, 85, 86, 87}


def span(versions: tuple[int, int] | None) -> str:
    if versions is None:
        return ""
    lo, hi = versions
    return str(lo) if lo == hi else f"{lo}–{hi}"


def kafka_versions(name: str) -> tuple[int, int]:
    vs = sorted(v for v, types in schema_name_map[name].items() if types)
    return vs[0], vs[-1]


def pretty(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def rows() -> list[str]:
    out = ["| key | API | Kafka 4.x | oncelog | note |", "|---:|---|---|---|---|"]
    for key in sorted(api_key_map):
        name = api_key_map[key]
        kafka = span(kafka_versions(name))
        served = BROKER_VERSIONS.get(key)
        note = ""
        if served is None and key in TRANSACTION_VERSIONS:
            note = f"pending issue 16 (transactions): {span(TRANSACTION_VERSIONS[key])}"
        elif served is None and key in SECURITY_VERSIONS:
            note = f"pending issue 18 (security): {span(SECURITY_VERSIONS[key])}"
        elif key in CONTROLLER_ONLY:
            note = "controller only"
            if key in CONTROLLER_VERSIONS:
                note += f"; oncelog's controller listener: {span(CONTROLLER_VERSIONS[key])}"
        elif key in INTER_BROKER:
            note = "broker to broker"
        elif served is None:
            note = "not served"
        else:
            notes = []
            if served[0] < kafka_versions(name)[0]:
                notes.append(f"{span((served[0], kafka_versions(name)[0] - 1))}: Kafka 3.x's (v0/v1 "
                             "message sets, for clients that do not ask ApiVersions), dropped by 4.0")
            if served[1] > kafka_versions(name)[1]:
                notes.append(f"v{served[1]}: KIP-1269's ProducerStateBatchesToRetain, not in Kafka")
            note = "; ".join(notes)
        out.append(f"| {key} | {pretty(name)} | {kafka} | {span(served)} | {note} |")
    return out


if __name__ == "__main__":
    served = len(BROKER_VERSIONS)
    client = len([k for k in api_key_map if k not in CONTROLLER_ONLY | INTER_BROKER])
    print("\n".join(rows()))
    print(f"\noncelog serves {served} of the {client} APIs Kafka 4.x offers clients on a broker.")
