"""Finalized features (KIP-584), Kafka's way of switching a protocol on for a whole cluster: the
controller keeps each feature's level in its metadata log, every broker reports it in ApiVersions
(FinalizedFeatures, with an epoch that only grows), and clients decide from it.

oncelog has two. `share.version` (Kafka's ShareVersion), supported 0-2 and finalized at 1 for a
new cluster as Kafka 4.2 does: at 1 the broker serves share groups (KIP-932) and ApiVersions lists
their APIs; at 0 it lists none of them and answers them UNSUPPORTED_VERSION; at 2 (Kafka 4.4's
SV_2) share groups may also have dead-letter topics (KIP-1191), each group opting in with its
`errors.deadletterqueue.topic.name`.
`transaction.version` (Kafka 4.0's `TransactionVersion`), supported 0-2 and finalized at 2
unless an operator changes it (`kafka-features.sh` or `oncelog features`, through UpdateFeatures).
At 2, clients that know it (Kafka's Java producer from 4.0, oncelog's producer) use Transactions
V2 (KIP-890 part 2); the broker serves both versions whatever the level, by the request versions
each client sends, as Kafka does.

Pure: `decide` checks an UpdateFeatures request and returns the records the controller appends;
`replay` applies them, on the controller and on every broker that follows its log.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

TRANSACTION_VERSION = "transaction.version"
# Kafka's ShareVersion: 1 serves share groups (KIP-932), production-ready and finalized for new
# clusters from Kafka 4.2; 2 adds dead-letter topics (KIP-1191, Kafka 4.4), off until an operator
# upgrades to it (and each group still opts in).
SHARE_VERSION = "share.version"
SHARE_VERSION_DLQ = 2
SUPPORTED: dict[str, tuple[int, int]] = {TRANSACTION_VERSION: (0, 2), SHARE_VERSION: (0, 2)}
DEFAULT_LEVELS: dict[str, int] = {TRANSACTION_VERSION: 2, SHARE_VERSION: 1}
FEATURE_RECORD = "feature_level"

# UpdateFeatures' upgrade types (v1+; v0's allowDowngrade=true means SAFE_DOWNGRADE)
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


@dataclass
class FinalizedFeatures:
    """Each feature's finalized level and the epoch of the last change (0: the defaults, never
    changed). A level of 0 is "not finalized", which ApiVersions leaves out, as Kafka does."""
    levels: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_LEVELS))
    epoch: int = 0

    def level(self, name: str) -> int:
        return self.levels.get(name, 0)

    def finalized(self) -> dict[str, int]:
        return {name: level for name, level in sorted(self.levels.items()) if level > 0}

    def decide(self, updates: Iterable[tuple[str, int, int]]) -> list[dict[str, Any]]:
        """(feature, level, upgrade type) for each update: the records to append, or
        KafkaProtocolError (INVALID_UPDATE_VERSION, as Kafka's QuorumFeatures answers) for a
        feature oncelog lacks, a level outside its range, or a downgrade not asked for as one.
        A level below 1 removes the feature (level 0)."""
        wanted: dict[str, int] = {}
        for name, level, upgrade_type in updates:
            if name in wanted:
                raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"feature {name!r} is updated twice")
            lo, hi = SUPPORTED.get(name, (None, None))
            if lo is None or hi is None:
                raise KafkaProtocolError(ErrorCode.INVALID_UPDATE_VERSION,
                                         f"feature {name!r} is not supported (supported: {', '.join(SUPPORTED)})")
            level = max(level, 0)
            if not lo <= level <= hi:
                raise KafkaProtocolError(ErrorCode.INVALID_UPDATE_VERSION,
                                         f"{name} level {level} is outside the supported range {lo}-{hi}")
            if upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
                raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"unknown upgrade type {upgrade_type}")
            if level < self.level(name) and upgrade_type == UPGRADE:
                raise KafkaProtocolError(ErrorCode.INVALID_UPDATE_VERSION,
                                         f"{name} from {self.level(name)} to {level} is a downgrade: "
                                         "ask for a downgrade")
            wanted[name] = level
        changes = {name: level for name, level in wanted.items() if level != self.level(name)}
        epoch = self.epoch + 1
        return [{"type": FEATURE_RECORD, "name": name, "level": level, "epoch": epoch}
                for name, level in sorted(changes.items())]

    def replay(self, record: dict[str, Any]) -> None:
        if record.get("type") != FEATURE_RECORD:
            raise ValueError(f"not a feature record: {record.get('type')!r}")
        name, level, epoch = record["name"], int(record["level"]), int(record["epoch"])
        if name not in SUPPORTED or not SUPPORTED[name][0] <= level <= SUPPORTED[name][1] or epoch < self.epoch:
            raise ValueError(f"feature record {record!r} does not apply (epoch {self.epoch})")
        self.levels[name] = level
        self.epoch = epoch

    def to_snapshot(self) -> dict[str, Any]:
        return {"levels": dict(self.levels), "epoch": self.epoch}

    @classmethod
    def from_snapshot(cls, data: dict[str, Any] | None) -> FinalizedFeatures:
        if not data:
            return cls()
        return cls({str(k): int(v) for k, v in data["levels"].items()}, int(data["epoch"]))
