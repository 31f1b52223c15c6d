"""SCRAM credentials as the controller keeps them (Kafka's ScramControlManager and ScramImage):
AlterUserScramCredentials decided into records, DescribeUserScramCredentials answered from
state, the bootstrap credentials of `--add-scram`, replay and snapshots.

Records (JSON objects in the metadata log; Kafka's UserScramCredentialRecord and
RemoveUserScramCredentialRecord, bytes as base64):
    {"type": "scram_credential", "name": str, "mechanism": 1|2, "salt": b64,
     "stored_key": b64, "server_key": b64, "iterations": int}
    {"type": "remove_scram_credential", "name": str, "mechanism": 1|2}

The salted password an upsertion carries is turned into StoredKey/ServerKey before anything is
written, so no record holds material a client could log in with.
"""
from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from oncelog.core.security.scram import (
    AddScram,
    CredentialShape,
    ScramCredential,
    ScramMechanism,
    check_iterations,
    credential_from_salted_password,
)
from oncelog.protocol.errors import ErrorCode

SCRAM_RECORD, REMOVE_SCRAM_RECORD = "scram_credential", "remove_scram_credential"
_DUPLICATE = "A user credential cannot be altered twice in the same request"


@dataclass(frozen=True)
class Deletion:
    name: str
    mechanism: int            # the wire type (1 SHA-256, 2 SHA-512); others are refused


@dataclass(frozen=True)
class Upsertion:
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True)
class AlterResult:
    user: str
    error_code: ErrorCode
    error_message: str | None = None


@dataclass(frozen=True)
class DescribeResult:
    user: str
    error_code: ErrorCode
    error_message: str | None
    credentials: tuple[tuple[int, int], ...]    # (mechanism type, iterations)


def credential_record(name: str, mechanism: ScramMechanism, c: ScramCredential) -> dict[str, Any]:
    b64: Callable[[bytes], str] = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return {"type": SCRAM_RECORD, "name": name, "mechanism": mechanism.type, "salt": b64(c.salt),
            "stored_key": b64(c.stored_key), "server_key": b64(c.server_key), "iterations": c.iterations}


def remove_credential_record(name: str, mechanism: ScramMechanism) -> dict[str, Any]:
    return {"type": REMOVE_SCRAM_RECORD, "name": name, "mechanism": mechanism.type}


def _validate_name_and_mechanism(name: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if ScramMechanism.from_type(mechanism) is None:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    return None


class ScramCredentials:
    def __init__(self) -> None:
        self._creds: dict[tuple[str, ScramMechanism], ScramCredential] = {}
        # per mechanism, how many credentials have each (salt length, iterations): what the SCRAM
        # mock of a user that does not exist looks like (`scram.mock_credential`)
        self._shapes: dict[ScramMechanism, dict[CredentialShape, int]] = {m: {} for m in ScramMechanism}

    def __len__(self) -> int:
        return len(self._creds)

    def lookup(self, name: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self._creds.get((name, mechanism))

    def shapes(self, mechanism: ScramMechanism) -> dict[CredentialShape, int]:
        """A live view (read-only): shape -> number of stored credentials of `mechanism` with it."""
        return self._shapes[mechanism]

    def _count_shape(self, mechanism: ScramMechanism, c: ScramCredential, delta: int) -> None:
        shape = CredentialShape(len(c.salt), c.iterations)
        counts = self._shapes[mechanism]
        n = counts.get(shape, 0) + delta
        if n > 0:
            counts[shape] = n
        else:
            counts.pop(shape, None)

    def users(self) -> set[str]:
        return {name for name, _ in self._creds}

    # ------------------------------------------------------------------ decide (no change)
    def decide_alter(self, deletions: Sequence[Deletion],
                     upsertions: Sequence[Upsertion]) -> tuple[list[dict[str, Any]], list[AlterResult]]:
        """AlterUserScramCredentials: a user named twice in one request fails whole with
        DUPLICATE_RESOURCE; results list deletions, then upsertions, then failures (Kafka's order)."""
        to_delete: dict[str, Deletion] = {}
        to_upsert: dict[str, Upsertion] = {}
        errors: dict[str, tuple[ErrorCode, str]] = {}
        for d in deletions:
            if d.name in errors:
                continue
            if to_delete.pop(d.name, None) is not None:
                errors[d.name] = (ErrorCode.DUPLICATE_RESOURCE, _DUPLICATE)
                continue
            problem = _validate_name_and_mechanism(d.name, d.mechanism)
            mech = ScramMechanism.from_type(d.mechanism)
            if problem is None and (d.name, mech) not in self._creds:
                problem = (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
            if problem:
                errors[d.name] = problem
            else:
                to_delete[d.name] = d
        for u in upsertions:
            if u.name in errors:
                continue
            if to_delete.pop(u.name, None) is not None or to_upsert.pop(u.name, None) is not None:
                errors[u.name] = (ErrorCode.DUPLICATE_RESOURCE, _DUPLICATE)
                continue
            problem = _validate_name_and_mechanism(u.name, u.mechanism)
            if problem is None:
                bad = check_iterations(ScramMechanism.from_type(u.mechanism), u.iterations)  # type: ignore[arg-type]
                problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, bad) if bad else None
            if problem is None and not u.salted_password:
                problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salted password must not be empty")
            if problem:
                errors[u.name] = problem
            else:
                to_upsert[u.name] = u
        records: list[dict[str, Any]] = []
        results: list[AlterResult] = []
        for d in to_delete.values():
            records.append(remove_credential_record(d.name, ScramMechanism.from_type(d.mechanism)))  # type: ignore[arg-type]
            results.append(AlterResult(d.name, ErrorCode.NONE))
        for u in to_upsert.values():
            mech = ScramMechanism.from_type(u.mechanism)
            assert mech is not None
            cred = credential_from_salted_password(mech, u.salt, u.salted_password, u.iterations)
            records.append(credential_record(u.name, mech, cred))
            results.append(AlterResult(u.name, ErrorCode.NONE))
        results.extend(AlterResult(user, code, msg) for user, (code, msg) in errors.items())
        return records, results

    def decide_bootstrap(self, adds: Iterable[AddScram]) -> list[dict[str, Any]]:
        """`--add-scram` at start: a credential is written only where the user has none for that
        mechanism yet, so a password changed later with AlterUserScramCredentials survives
        restarts with the same command line."""
        records, seen = [], set()
        for a in adds:
            key = (a.name, a.mechanism)
            if key in self._creds or key in seen:
                continue
            seen.add(key)
            records.append(credential_record(a.name, a.mechanism, a.credential))
        return records

    def describe(self, users: Sequence[str] | None) -> list[DescribeResult]:
        """DescribeUserScramCredentials: None or empty means every user with a credential."""
        if not users:
            wanted = {name: False for name in sorted(self.users())}
        else:
            wanted = {}
            for name in users:
                wanted[name] = name in wanted
        out = []
        for name, duplicate in wanted.items():
            if duplicate:
                out.append(DescribeResult(name, ErrorCode.DUPLICATE_RESOURCE,
                                          f"Cannot describe SCRAM credentials for the same user twice in a "
                                          f"single request: {name}", ()))
                continue
            infos = tuple((m.type, c.iterations) for m in ScramMechanism
                          if (c := self._creds.get((name, m))) is not None)
            if infos:
                out.append(DescribeResult(name, ErrorCode.NONE, None, infos))
            else:
                out.append(DescribeResult(name, ErrorCode.RESOURCE_NOT_FOUND,
                                          f"Attempt to describe a user credential that does not exist: {name}", ()))
        return out

    # ------------------------------------------------------------------ the only change
    def replay(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        mech = ScramMechanism.from_type(record.get("mechanism"))  # type: ignore[arg-type]
        name = record.get("name")
        if mech is None or not isinstance(name, str) or not name:
            raise ValueError(f"bad SCRAM credential record {record!r}")
        if kind == SCRAM_RECORD:
            try:
                cred = ScramCredential(base64.b64decode(record["salt"], validate=True),
                                       base64.b64decode(record["stored_key"], validate=True),
                                       base64.b64decode(record["server_key"], validate=True),
                                       int(record["iterations"]))
            except (KeyError, TypeError, ValueError, binascii.Error) as e:
                raise ValueError(f"bad SCRAM credential record for {name!r}: {e}") from None
            replaced = self._creds.get((name, mech))
            if replaced is not None:
                self._count_shape(mech, replaced, -1)
            self._creds[(name, mech)] = cred
            self._count_shape(mech, cred, 1)
        elif kind == REMOVE_SCRAM_RECORD:
            removed = self._creds.pop((name, mech), None)
            if removed is None:
                raise ValueError(f"Unable to find credential to delete: {name} {mech.mechanism_name}")
            self._count_shape(mech, removed, -1)
        else:
            raise ValueError(f"not a SCRAM credential record: {kind!r}")

    # ------------------------------------------------------------------ snapshots
    def to_snapshot(self) -> list[dict[str, Any]]:
        return [credential_record(n, m, c)
                for (n, m), c in sorted(self._creds.items(), key=lambda kv: (kv[0][0], kv[0][1].type))]

    @classmethod
    def from_snapshot(cls, records: Iterable[dict[str, Any]]) -> ScramCredentials:
        store = cls()
        for r in records:
            store.replay(r)
        return store
