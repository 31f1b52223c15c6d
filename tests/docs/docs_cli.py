"""The `oncelog` command tree and argument checks for the docs tests, asked of tests/docs/cli_tree.py
in one process per test module (tests never import oncelog.cli)."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

CLI_TREE = Path(__file__).with_name("cli_tree.py")


def ask(argvs: list[list[str]] = ()) -> tuple[dict[str, dict], list[str | None]]:  # type: ignore[assignment]
    """The tree ({"topic list": {"options": [...], "commands": [...]}, ...}) and, for each argv
    (the words after `oncelog`), None if the command line parses or click's error."""
    env = {k: v for k, v in os.environ.items() if k != "ONCELOG_BOOTSTRAP_SERVER"}
    r = subprocess.run([sys.executable, str(CLI_TREE)], input=json.dumps({"parse": [list(a) for a in argvs]}),
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    answer = json.loads(r.stdout)
    return answer["tree"], answer["parse"]


@functools.lru_cache(maxsize=1)
def tree() -> dict[str, dict]:
    return ask([])[0]
