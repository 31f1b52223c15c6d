"""docs/operations.md's "Kafka APIs served" table, generated from the versions the broker
advertises (`oncelog.protocol.api.BROKER_VERSIONS`): one row per API in key order, its
versions from the code, its notes kept from the document. After a change to the served
versions, `.venv/bin/python tests/docs/api_table.py` rewrites the table (then write the notes of
a new API); tests/docs/test_api_table.py fails until the table agrees with the code."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from oncelog.protocol.api import BROKER_VERSIONS, ApiKey

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
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


if __name__ == "__main__":
    OPERATIONS.write_text(regenerated(OPERATIONS.read_text()))
    print(f"rewrote the API table of {OPERATIONS}", file=sys.stderr)
