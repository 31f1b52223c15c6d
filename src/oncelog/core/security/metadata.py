"""The part of the controller's metadata log that every broker follows: ACLs, SCRAM credentials,
client quotas, dynamic broker configs (`core.broker_config`) and finalized features
(`core.features`), replayed from records and saved in snapshots together.

The controller appends what `Acls.decide_*`, `ScramCredentials.decide_*`,
`ClientQuotaStore.decide_alter` and `BrokerConfigStore.decide` return, fsyncs, then calls
`replay` here; a broker that follows the log calls the same `replay`, so both hold the same
state. Record types are listed in `RECORD_TYPES`; `replay` refuses anything malformed with
ValueError (a log that fails to replay is corrupt, as for producer-id blocks).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oncelog.core.broker_config import BROKER_CONFIG_RECORD, BrokerConfigStore
from oncelog.core.features import FEATURE_RECORD, FinalizedFeatures
from oncelog.core.security.acl import ACL_RECORD, REMOVE_ACL_RECORD
from oncelog.core.security.authorizer import Acls
from oncelog.core.security.credentials import REMOVE_SCRAM_RECORD, SCRAM_RECORD, ScramCredentials
from oncelog.core.security.quotas import QUOTA_RECORD, ClientQuotaStore

RECORD_TYPES = frozenset({ACL_RECORD, REMOVE_ACL_RECORD, SCRAM_RECORD, REMOVE_SCRAM_RECORD, QUOTA_RECORD,
                          BROKER_CONFIG_RECORD, FEATURE_RECORD})
SNAPSHOT_VERSION = 1


@dataclass
class SecurityMetadata:
    acls: Acls = field(default_factory=Acls)
    scram: ScramCredentials = field(default_factory=ScramCredentials)
    quotas: ClientQuotaStore = field(default_factory=ClientQuotaStore)
    broker_configs: BrokerConfigStore = field(default_factory=BrokerConfigStore)
    features: FinalizedFeatures = field(default_factory=FinalizedFeatures)

    @staticmethod
    def handles(record: dict[str, Any]) -> bool:
        return record.get("type") in RECORD_TYPES

    def replay(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind in (ACL_RECORD, REMOVE_ACL_RECORD):
            self.acls.replay(record)
        elif kind in (SCRAM_RECORD, REMOVE_SCRAM_RECORD):
            self.scram.replay(record)
        elif kind == QUOTA_RECORD:
            self.quotas.replay(record)
        elif kind == BROKER_CONFIG_RECORD:
            self.broker_configs.replay(record)
        elif kind == FEATURE_RECORD:
            self.features.replay(record)
        else:
            raise ValueError(f"not a security record: {kind!r}")

    def to_snapshot(self) -> dict[str, Any]:
        return {"version": SNAPSHOT_VERSION, "acls": self.acls.to_snapshot(),
                "scram": self.scram.to_snapshot(), "quotas": self.quotas.to_snapshot(),
                "broker_configs": self.broker_configs.to_snapshot(), "features": self.features.to_snapshot()}

    @classmethod
    def from_snapshot(cls, data: dict[str, Any] | None) -> SecurityMetadata:
        if not data:
            return cls()
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"security snapshot version {data.get('version')!r} is not {SNAPSHOT_VERSION}")
        return cls(Acls.from_snapshot(data.get("acls", ())), ScramCredentials.from_snapshot(data.get("scram", ())),
                   ClientQuotaStore.from_snapshot(data.get("quotas", ())),
                   BrokerConfigStore.from_snapshot(data.get("broker_configs", ())),
                   FinalizedFeatures.from_snapshot(data.get("features")))
