"""docs/coming-from-kafka.md stays true: its table of broker defaults names oncelog's real
defaults, and its Python snippet runs as written against a broker (the list of APIs not served
is tests/docs/test_api_table.py's)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.broker.config import BrokerConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "coming-from-kafka.md"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_broker_defaults_table_is_oncelogs():
    rows = re.findall(r"^\| `([a-z.]+)` \| [^|]+ \| ([^|]+) \|", _section(PAGE.read_text(), "## Broker defaults"),
                      re.M)
    assert len(rows) >= 8
    defaults = BrokerConfig.load(None, {})
    for name, shown in rows:
        value = defaults[name]
        text = shown.strip().strip("`").split(" ")[0].strip("`")
        assert text == str(value).lower() if isinstance(value, bool) else text == str(value), (name, shown, value)


@pytest.mark.processes
def test_the_asyncio_snippet_runs_as_written(shared_broker):
    code = re.search(r"```python\n(.*?)```", _section(PAGE.read_text(), "## The Python client"), re.S)
    assert code is not None
    source = code.group(1).replace("127.0.0.1:9092", shared_broker.bootstrap)
    r = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"written at offset \d+\nb'hello'\n", r.stdout), r.stdout
