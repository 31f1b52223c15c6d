"""docs/operations.md says every list and describe takes `--format json` (issue 39, item 7:
`admin pid-blocks` did not): every command of `oncelog` that lists or describes takes it, and each
has its JSON shape in the document. The commands are read from click's tree in one process
(tests/docs/cli_tree.py), not from a `--help` per command (about a second of CPU each)."""
from __future__ import annotations

from pathlib import Path

from docs_cli import tree

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
# commands that print a listing or a description besides those named list / describe*
LISTINGS = {"pid-blocks", "log-dirs", "find-hanging", "seek", "delete-records", "trim-prefix", "delete-offsets"}
# a description of files rather than the cluster: its own text format, no table
NOT_LISTINGS = {"log dump"}


def test_every_list_and_describe_takes_format_json_and_has_a_documented_shape():
    doc = OPERATIONS.read_text()
    shapes = doc[doc.index("**JSON shapes**"):]
    checked = []
    for path, command in tree().items():
        words = path.split()
        if len(words) != 2 or command["commands"] or path in NOT_LISTINGS:
            continue
        name = words[-1]
        if name == "list" or name.startswith("describe") or name in LISTINGS:
            assert "--format" in command["options"], f"oncelog {path} has no --format"
            assert f"`{path}" in shapes or f"{path}`" in shapes, f"oncelog {path}: no JSON shape in docs/operations.md"
            checked.append(path)
    assert {"admin pid-blocks", "topic list", "group describe", "cluster log-dirs", "share-group list",
            "transactions find-hanging"} <= set(checked)
