"""docs/operations.md says every list and describe takes `--format json` (issue 39, item 7:
`admin pid-blocks` did not): every command of `oncelog`, found from its own help, that lists or
describes takes it, and each has its JSON shape in the document."""
from __future__ import annotations

import re
from pathlib import Path

from tests.cli.oncelog_cli import oncelog

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
# commands that print a listing or a description besides those named list / describe*
LISTINGS = {"pid-blocks", "log-dirs", "find-hanging", "seek", "delete-records", "trim-prefix", "delete-offsets",
            "reset-offsets"}
# a description of files rather than the cluster: its own text format, no table
NOT_LISTINGS = {("log", "dump")}


def _help(*args: str) -> str:
    r = oncelog(*args, "--help", timeout=60)
    assert r.code == 0, r.err
    return r.out


def _subcommands(text: str) -> list[str]:
    section = text.split("Commands:", 1)
    return re.findall(r"^  ([a-z][a-z-]*)", section[1], re.M) if len(section) == 2 else []


def test_every_list_and_describe_takes_format_json_and_has_a_documented_shape():
    doc = OPERATIONS.read_text()
    shapes = doc[doc.index("**JSON shapes**"):]
    checked = []
    for group in _subcommands(_help()):
        for command in _subcommands(_help(group)):
            if (group, command) in NOT_LISTINGS:
                continue
            if command == "list" or command.startswith("describe") or command in LISTINGS:
                text = _help(group, command)
                assert "--format" in text, f"oncelog {group} {command} has no --format"
                assert f"`{group} {command}" in shapes or f"{group} {command}`" in shapes, \
                    f"oncelog {group} {command}: no JSON shape in docs/operations.md"
                checked.append(f"{group} {command}")
    assert {"admin pid-blocks", "topic list", "group describe", "cluster log-dirs"} <= set(checked)
