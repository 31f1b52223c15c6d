"""The controller's security records (ACLs and client quotas; SCRAM credentials join them through
the same `SecurityMetadata`) and dynamic broker configs: CreateAcls, DeleteAcls, AlterClientQuotas
and IncrementalAlterConfigs on a BROKER resource forwarded by brokers, and the feed brokers follow
them by.

Brokers authorize the caller (they know its principal) and forward under their own cluster
principal; here only cluster rights are checked. Each change is decided by the pure stores
(`Acls.decide_*`, `ClientQuotaStore.decide_alter`), appended and fsynced by the controller's
`commit`, then replayed.

The feed (`protocol.api.SECURITY_RECORDS_KEY`, an oncelog-internal request on the controller listener, never
advertised): the request body is JSON `{"after": N}`, N the metadata-log offset up to which the
broker has applied security records (-1 at its start); the answer is `{"end": M, "records": [...]}`
with the security records of offsets N..M-1, or `{"end": M, "snapshot": {...}}` when the broker
has nothing yet or names an offset this log does not have (another controller, a lost tail).
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from oncelog.core.broker_config import apply_ops, check_names
from oncelog.core.security.acl import AclBinding, binding_from_wire, filter_from_wire
from oncelog.core.security.metadata import SecurityMetadata
from oncelog.core.security.quotas import alterations_from_wire
from oncelog.core.topic_config import ConfigError
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.metadata_log import MetadataLog


class ControllerSecurity:
    def __init__(self, log: MetadataLog, commit: Callable[[list[dict[str, Any]]], None]) -> None:
        self.state = SecurityMetadata()
        self._log = log
        self._commit = commit
        self.last_offset = -1      # offset of the newest security record applied

    # ------------------------------------------------------------------ state
    def load_snapshot(self, data: dict[str, Any] | None, offset: int) -> None:
        self.state = SecurityMetadata.from_snapshot(data)
        if data:
            self.last_offset = offset - 1

    def replay(self, record: dict[str, Any], offset: int) -> bool:
        if not SecurityMetadata.handles(record):
            return False
        self.state.replay(record)
        self.last_offset = max(self.last_offset, offset)
        return True

    # ------------------------------------------------------------------ forwarded changes
    def create_acls(self, rb: Any, r: Any, authorized: bool) -> bytes:
        results: list[tuple[ErrorCode, str | None]]
        if not authorized:
            results = [(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None)] * len(r.creations)
        else:
            records, results = self.state.acls.decide_create([binding_from_wire(c) for c in r.creations],
                                                             lambda: str(uuid.uuid4()))
            try:
                self._commit(records)
            except KafkaProtocolError as e:
                results = [(ErrorCode(e.code), e.message)] * len(r.creations)
        return rb.encode(throttle_time=0, results=tuple(
            rb("AclCreationResult", error_code=code, error_message=msg) for code, msg in results))

    def delete_acls(self, rb: Any, r: Any, authorized: bool) -> bytes:
        results: list[tuple[ErrorCode, str | None, list[AclBinding]]]
        if not authorized:
            results = [(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None, [])] * len(r.filters)
        else:
            records, results = self.state.acls.decide_delete([filter_from_wire(f) for f in r.filters])
            try:
                self._commit(records)
            except KafkaProtocolError as e:
                results = [(ErrorCode(e.code), e.message, [])] * len(r.filters)
        out = []
        for code, msg, bindings in results:
            out.append(rb("DeleteAclsFilterResult", error_code=code, error_message=msg, matching_acls=tuple(
                rb("DeleteAclsMatchingAcl", error_code=0, error_message=None,
                   resource_type=b.pattern.resource_type, resource_name=b.pattern.name,
                   pattern_type=b.pattern.pattern_type, principal=b.entry.principal, host=b.entry.host,
                   operation=b.entry.operation, permission_type=b.entry.permission_type)
                for b in bindings)))
        return rb.encode(throttle_time=0, filter_results=tuple(out))

    def alter_client_quotas(self, rb: Any, r: Any, authorized: bool) -> bytes:
        alterations = alterations_from_wire(r.entries)
        results: list[tuple[Sequence[tuple[str, str | None]], ErrorCode, str | None]]
        if not authorized:
            results = [(a.entity, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None) for a in alterations]
        else:
            records, results = self.state.quotas.decide_alter(alterations)
            try:
                if not r.validate_only:
                    self._commit(records)
            except KafkaProtocolError as e:
                results = [(a.entity, ErrorCode(e.code), e.message) for a in alterations]
        return rb.encode(throttle_time=0, entries=tuple(
            rb("EntryData", error_code=code, error_message=msg, entity=tuple(
                rb("EntityData", entity_type=k, entity_name=n) for k, n in entity))
            for entity, code, msg in results))

    def alter_broker_configs(self, scope: str, ops: Sequence[tuple[str, int, str | None]],
                             validate_only: bool) -> None:
        """A BROKER resource's IncrementalAlterConfigs ops, applied to what the log holds for the
        scope (the forwarding broker has checked the values' types, as Kafka's brokers do before
        they forward); raises KafkaProtocolError."""
        if scope and not (scope.isdigit() and scope.isascii()):
            raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, "Unable to parse broker name as a base 10 number.")
        store = self.state.broker_configs
        try:
            check_names([name for name, _, _ in ops], per_broker=scope != "")
        except ConfigError as e:
            raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, str(e)) from None
        try:
            wanted = apply_ops(store.get(scope), ops)
        except ConfigError as e:
            raise KafkaProtocolError(ErrorCode.INVALID_CONFIG, str(e)) from None
        if not validate_only:
            self._commit(store.decide(scope, wanted))

    def update_features(self, updates: Sequence[tuple[str, int, int]], validate_only: bool) -> None:
        """UpdateFeatures forwarded by a broker (which checked the caller's ALTER on the
        cluster): raises KafkaProtocolError."""
        records = self.state.features.decide(updates)
        if not validate_only:
            self._commit(records)

    # ------------------------------------------------------------------ the feed
    def follow(self, body: bytes | memoryview) -> bytes:
        try:
            after = int(json.loads(bytes(body))["after"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"bad security feed request: {e}") from None
        end = self._log.end_offset
        if after < 0 or after > end:
            answer: dict[str, Any] = {"end": end, "snapshot": self.state.to_snapshot()}
        elif after > self.last_offset:
            answer = {"end": end, "records": []}
        else:
            answer = {"end": end, "records": [r for _, r in self._log.read(after)
                                              if SecurityMetadata.handles(r)]}
        return json.dumps(answer, separators=(",", ":")).encode()
