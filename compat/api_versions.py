#!/usr/bin/env python3
"""Prints the Markdown table of docs/compatibility.md: the Kafka APIs oncelog serves beside Kafka's
(tests/docs/api_table.py makes it, and rewrites it in place when run; tests/docs/test_api_table.py
keeps the document equal to it).

    .venv/bin/python compat/api_versions.py > /tmp/table.md
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "docs")]

from api_table import BROKER_VERSIONS, CONTROLLER_ONLY, INTER_BROKER, compat_rows, kafka_apis  # noqa: E402

if __name__ == "__main__":
    print(compat_rows(), end="")
    client = len([k for k in kafka_apis() if k not in CONTROLLER_ONLY | INTER_BROKER])
    print(f"\noncelog serves {len(BROKER_VERSIONS)} of the {client} APIs Kafka 4.x offers clients on a broker.")
