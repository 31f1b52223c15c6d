"""docs/operations.md's "Kafka APIs served" table, generated from the versions the broker
advertises (`oncelog.protocol.api.BROKER_VERSIONS`): one row per API in key order, its
versions from the code, its notes kept from the document; and docs/compatibility.md's table of
every Kafka 4.x API beside oncelog's versions (Kafka's from kio's schemas, generated from Kafka's
message definitions). After a change to the served versions, `.venv/bin/python
tests/docs/api_table.py` rewrites both tables (then write the notes of a new API);
tests/docs/test_api_table.py fails until they agree with the code."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from oncelog.protocol.api import BROKER_VERSIONS, CONTROLLER_VERSIONS, ApiKey

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
COMPATIBILITY = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
COMPAT_HEADING = "## Kafka APIs served, against Kafka 4.x"
COMPAT_HEADER = "| key | API | Kafka 4.x | oncelog | note |\n|---:|---|---|---|---|\n"
# Kafka's message definitions whose "listeners" name only the controller (KRaft quorum and
# broker-to-controller RPCs): no client sends them to a broker
CONTROLLER_ONLY = {52, 53, 54, 56, 58, 59, 62, 63, 67, 70, 73, 80, 81, 82}
# broker-to-broker RPCs (share coordinator state): on the broker listener, not for clients
INTER_BROKER = {83, 84, 85, 86, 87}
HEADING = "## Kafka APIs served"
HEADER = "| API (key) | versions | notes |\n|---|---|---|\n"
ROW = re.compile(r"^\| (?P<name>\w+) \((?P<key>\d+)\) \| (?P<versions>[^|]+) \| (?P<notes>.*) \|$")


def kafka_name(key: int) -> str:
    return "".join(part.capitalize() for part in ApiKey(key).name.split("_"))


def versions(key: int) -> str:
    lo, hi = BROKER_VERSIONS[key]
    return f"{lo}–{hi}" if lo != hi else str(lo)


def table_span(text: str) -> tuple[int, int]:
    """Where the table under HEADING starts and ends in `text`."""
    start = text.index(HEADER, text.index(HEADING))
    end = start + len(HEADER)
    while end < len(text) and text.startswith("|", end):
        end = text.index("\n", end) + 1
    return start, end


def notes_of(text: str) -> dict[str, str]:
    start, end = table_span(text)
    out = {}
    for line in text[start + len(HEADER):end].splitlines():
        m = ROW.match(line)
        if m:
            out[m.group("name")] = m.group("notes").strip()
    return out


def render(notes: dict[str, str]) -> str:
    rows = [f"| {kafka_name(k)} ({k}) | {versions(k)} | {notes.get(kafka_name(k), '')} |"
            for k in sorted(BROKER_VERSIONS)]
    return HEADER + "\n".join(rows) + "\n"


def regenerated(text: str) -> str:
    start, end = table_span(text)
    return text[:start] + render(notes_of(text)) + text[end:]


def span(versions: tuple[int, int] | None) -> str:
    if versions is None:
        return ""
    lo, hi = versions
    return str(lo) if lo == hi else f"{lo}–{hi}"


def kafka_apis() -> dict[int, tuple[str, tuple[int, int]]]:
    """{key: (Kafka's name, (min, max) versions)} of every API in kio's schemas."""
    from kio.schema.index import api_key_map, schema_name_map
    out = {}
    for key, name in api_key_map.items():
        vs = sorted(v for v, types in schema_name_map[name].items() if types)
        out[int(key)] = ("".join(part.capitalize() for part in name.split("_")), (vs[0], vs[-1]))
    return out


def compat_rows() -> str:
    rows = []
    for key, (name, kafka) in sorted(kafka_apis().items()):
        served = BROKER_VERSIONS.get(key)
        if key in CONTROLLER_ONLY:
            note = "controller only" + (f"; oncelog's controller listener: {span(CONTROLLER_VERSIONS[key])}"
                                        if key in CONTROLLER_VERSIONS else "")
        elif key in INTER_BROKER:
            note = "broker to broker"
        elif served is None:
            note = "not served"
        else:
            notes = []
            if served[0] < kafka[0]:
                notes.append(f"{span((served[0], kafka[0] - 1))}: Kafka 3.x's (v0/v1 message sets, for clients "
                             "that do not ask ApiVersions), dropped by 4.0")
            if served[1] > kafka[1]:
                notes.append(f"v{served[1]}: KIP-1269's ProducerStateBatchesToRetain, not in Kafka")
            note = "; ".join(notes)
        rows.append(f"| {key} | {name} | {span(kafka)} | {span(served)} | {note} |")
    return COMPAT_HEADER + "\n".join(rows) + "\n"


def compat_span(text: str) -> tuple[int, int]:
    start = text.index(COMPAT_HEADER, text.index(COMPAT_HEADING))
    end = start + len(COMPAT_HEADER)
    while end < len(text) and text.startswith("|", end):
        end = text.index("\n", end) + 1
    return start, end


def regenerated_compat(text: str) -> str:
    start, end = compat_span(text)
    return text[:start] + compat_rows() + text[end:]


def not_served() -> list[str]:
    """Kafka's client APIs a broker of oncelog does not serve (docs/coming-from-kafka.md lists them)."""
    return [name for key, (name, _v) in sorted(kafka_apis().items())
            if key not in BROKER_VERSIONS and key not in CONTROLLER_ONLY | INTER_BROKER]


if __name__ == "__main__":
    OPERATIONS.write_text(regenerated(OPERATIONS.read_text()))
    COMPATIBILITY.write_text(regenerated_compat(COMPATIBILITY.read_text()))
    print(f"rewrote the API tables of {OPERATIONS} and {COMPATIBILITY}", file=sys.stderr)
