"""Share-group state (KIP-932's share coordinator and `__share_group_state`, as an equivalent store
behind the same interface): for each share-partition (group, topic id, partition) its state epoch,
its start offset (SPSO) and the state batches above it (`core.share.partition.StateBatch`).

Kafka's persister RPCs map one to one: InitializeShareGroupState (`initialize`),
ReadShareGroupState (`read`), WriteShareGroupState (`write`), DeleteShareGroupState (`delete`),
ReadShareGroupStateSummary (`read_summary`). A write carrying a state epoch below the stored one is
refused (FENCED_STATE_EPOCH in Kafka; `StaleStateEpoch` here): an old leader of the share-partition
cannot overwrite what a newer one wrote.

Group configs (`share.auto.offset.reset` ...) are kept apart (`<dir>/../group-configs/<group>.json`):
a group may have configs before it has any state, and its configs do not make it a share group.

One small JSON file per share-partition (`<dir>/<group>/<topic id>-<partition>.json`), replaced
atomically and fsynced before the request that changed the state is answered
(`storage.durable.replace_file`), so a crash never loses an acknowledgement that was answered and
never half-writes a state. Replacing the file is the compaction (Kafka's snapshot + updates
collapse into it). Writes go through `writing(group)`, the group's lease in a cluster (the same
fence as the group's offsets, `storage.group_offsets`), so a paused old owner writes nothing.
"""
from __future__ import annotations

import json
import shutil
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from oncelog.core.share.partition import StateBatch
from oncelog.storage.durable import fsync_dir, replace_file

_FORMAT = 1


class StaleStateEpoch(Exception):
    """A write with a state epoch older than the stored one (Kafka's FENCED_STATE_EPOCH)."""


@dataclass(frozen=True)
class ShareState:
    state_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...]


class ShareStateStore:
    def __init__(self, directory: str | Path,
                 writing: Callable[[str], AbstractContextManager[object]] | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.configs_dir = self.directory.parent / "group-configs"
        self._writing = writing or (lambda group: nullcontext())

    def _group_dir(self, group: str) -> Path:
        return self.directory / urllib.parse.quote(group, safe="")

    def _path(self, group: str, topic_id: uuid.UUID, partition: int) -> Path:
        return self._group_dir(group) / f"{topic_id}-{partition}.json"

    # ------------------------------------------------------------------ Kafka's persister
    def initialize(self, group: str, topic_id: uuid.UUID, partition: int, state_epoch: int,
                   start_offset: int) -> ShareState:
        """InitializeShareGroupState: a share-partition's first state (kept if one exists)."""
        current = self.read(group, topic_id, partition)
        if current is not None:
            return current
        state = ShareState(state_epoch, start_offset, ())
        self.write(group, topic_id, partition, state)
        return state

    def read(self, group: str, topic_id: uuid.UUID, partition: int) -> ShareState | None:
        try:
            data = json.loads(self._path(group, topic_id, partition).read_text())
        except FileNotFoundError:
            return None
        return ShareState(int(data["state_epoch"]), int(data["start_offset"]),
                          tuple(StateBatch(int(f), int(la), int(s), int(c)) for f, la, s, c in data["batches"]))

    def read_summary(self, group: str, topic_id: uuid.UUID, partition: int) -> tuple[int, int] | None:
        """ReadShareGroupStateSummary: (state epoch, start offset)."""
        state = self.read(group, topic_id, partition)
        return None if state is None else (state.state_epoch, state.start_offset)

    def write(self, group: str, topic_id: uuid.UUID, partition: int, state: ShareState) -> None:
        with self._writing(group):
            path = self._path(group, topic_id, partition)
            stored = self.read(group, topic_id, partition)
            if stored is not None and state.state_epoch < stored.state_epoch:
                raise StaleStateEpoch(f"{group} {topic_id}-{partition}: state epoch {state.state_epoch} "
                                      f"< stored {stored.state_epoch}")
            new_dir = not path.parent.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            if new_dir:
                fsync_dir(self.directory)
            replace_file(path, json.dumps({"format": _FORMAT, "state_epoch": state.state_epoch,
                                           "start_offset": state.start_offset,
                                           "batches": [[b.first_offset, b.last_offset, b.state, b.delivery_count]
                                                       for b in state.batches]}))

    def delete(self, group: str) -> None:
        """DeleteShareGroupState for every share-partition of the group."""
        with self._writing(group):
            d = self._group_dir(group)
            if d.exists():
                shutil.rmtree(d)
                fsync_dir(self.directory)

    def delete_partition(self, group: str, topic_id: uuid.UUID, partition: int) -> None:
        with self._writing(group):
            path = self._path(group, topic_id, partition)
            if path.exists():
                path.unlink()
                fsync_dir(path.parent)

    # ------------------------------------------------------------------ group configs
    def read_configs(self, group: str) -> dict[str, str]:
        """The group's configs (Kafka keeps them in the metadata log as GROUP config records)."""
        try:
            data = json.loads(self._configs_path(group).read_text())
        except FileNotFoundError:
            return {}
        return {str(k): str(v) for k, v in data["configs"].items()}

    def write_configs(self, group: str, configs: dict[str, str]) -> None:
        with self._writing(group):
            if not self.configs_dir.exists():
                self.configs_dir.mkdir(parents=True)
                fsync_dir(self.configs_dir.parent)
            replace_file(self._configs_path(group), json.dumps({"format": _FORMAT, "configs": configs}))

    def _configs_path(self, group: str) -> Path:
        return self.configs_dir / (urllib.parse.quote(group, safe="") + ".json")

    # ------------------------------------------------------------------ listings
    def has_group(self, group: str) -> bool:
        return self._group_dir(group).is_dir()

    def groups(self) -> list[str]:
        return sorted(urllib.parse.unquote(p.name) for p in self.directory.iterdir() if p.is_dir())

    def partitions(self, group: str) -> Iterator[tuple[uuid.UUID, int]]:
        d = self._group_dir(group)
        if not d.exists():
            return
        for p in sorted(d.glob("*.json")):
            topic, _, index = p.stem.rpartition("-")
            yield uuid.UUID(topic), int(index)
