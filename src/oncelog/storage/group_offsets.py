"""Committed consumer-group offsets: one small JSON file per group, replaced atomically and
fsynced before the commit is acknowledged (a crash never loses or half-writes a commit)."""
from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from typing import NamedTuple


class Committed(NamedTuple):
    offset: int
    metadata: str | None
    leader_epoch: int = -1


class GroupOffsetStore:
    def __init__(self, directory: str | Path, shared: bool = False) -> None:
        """`shared`: brokers of a cluster share the directory and a group's coordinator can move,
        so every read goes to the file (never a cached copy another broker may have replaced)."""
        self.shared = shared
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._groups: dict[str, dict[tuple[str, int], Committed]] = {}
        for path in self.directory.glob("*.json"):
            group = urllib.parse.unquote(path.stem)
            entries = json.loads(path.read_text())
            self._groups[group] = {(e["topic"], e["partition"]): Committed(e["offset"], e.get("metadata"),
                                                                           e.get("leader_epoch", -1))
                                   for e in entries}

    def groups(self) -> list[str]:
        return list(self._groups)

    def get(self, group: str) -> dict[tuple[str, int], Committed]:
        if self.shared:
            self._groups.pop(group, None)
            path = self._path(group)
            if path.exists():
                self._groups[group] = {(e["topic"], e["partition"]): Committed(e["offset"], e.get("metadata"),
                                                                               e.get("leader_epoch", -1))
                                       for e in json.loads(path.read_text())}
        return self._groups.get(group, {})

    def _path(self, group: str) -> Path:
        return self.directory / (urllib.parse.quote(group, safe="") + ".json")

    def commit(self, group: str, offsets: dict[tuple[str, int], Committed]) -> None:
        merged = {**self.get(group), **offsets}
        path = self._path(group)
        tmp = path.with_suffix(".tmp")
        data = [{"topic": t, "partition": p, "offset": c.offset, "metadata": c.metadata,
                 "leader_epoch": c.leader_epoch} for (t, p), c in sorted(merged.items())]
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._groups[group] = merged

    def delete_topic(self, topic: str) -> None:
        for group, offsets in list(self._groups.items()):
            if any(t == topic for t, _p in offsets):
                kept = {k: v for k, v in offsets.items() if k[0] != topic}
                self._groups[group] = {}
                self.commit(group, kept)
