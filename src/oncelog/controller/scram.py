"""SCRAM credentials in the controller's metadata log (Kafka's ScramControlManager): records of
`core.security.credentials`, AlterUserScramCredentials decided → appended → replayed, the
`--add-scram` bootstrap at start, and DescribeUserScramCredentials for brokers.

The store is `SecurityMetadata.scram` (replayed and snapshotted with ACLs and quotas by
`controller/security.py`); this module holds the credential APIs' controller side."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from oncelog.core.security.credentials import (
    Deletion,
    ScramCredentials,
    Upsertion,
    credential_record,
)
from oncelog.core.security.scram import AddScram, ScramMechanism
from oncelog.protocol import entities
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.metadata_log import MetadataLog

_log = logging.getLogger("oncelog.controller")


def bootstrap(store: ScramCredentials, adds: list[AddScram], log: MetadataLog) -> list[dict]:
    """`--add-scram`'s records, for a metadata log that is new (kafka-storage format writes them
    once, when it makes the log); for an existing one none, with a warning that they were ignored:
    a credential deleted or changed since is never brought back by a restart."""
    if not adds:
        return []
    if not log.is_new:
        _log.warning("--add-scram (oncelog.add.scram) ignored for %s: the metadata log in %s already exists, "
                     "and credentials are bootstrapped once, when it is created (as kafka-storage format "
                     "--add-scram does); change them with AlterUserScramCredentials",
                     ", ".join(sorted({a.name for a in adds})), log.directory)
        return []
    return store.decide_bootstrap(adds)


def format_log(directory: str | Path, adds: list[AddScram]) -> bool:
    """Bootstrap `adds` into the metadata log in `directory` if it is new (what `serve --brokers N`
    does before it starts its controller, so that no password reaches the controller's command
    line); False if it was not new (and nothing was written)."""
    log = MetadataLog(directory)
    try:
        records = bootstrap(ScramCredentials(), adds, log)
        log.append(records)
        return bool(records)
    finally:
        log.close()


def alter(store: ScramCredentials, rb: entities.ResponseBuilder, r, commit: Callable[[list[dict]], None]) -> bytes:
    """AlterUserScramCredentials: a storage failure fails every item (nothing was written)."""
    records, results = store.decide_alter(
        [Deletion(str(d.name), int(d.mechanism)) for d in r.deletions],
        [Upsertion(str(u.name), int(u.mechanism), int(u.iterations), bytes(u.salt), bytes(u.salted_password))
         for u in r.upsertions])
    answers = [(res.user, int(res.error_code), res.error_message) for res in results]
    try:
        commit(records)
    except KafkaProtocolError as e:
        answers = [(user, int(e.code), e.message) if code == ErrorCode.NONE else (user, code, message)
                   for user, code, message in answers]
    return rb.encode(throttle_time=0, results=tuple(
        rb("AlterUserScramCredentialsResult", user=user, error_code=code, error_message=message)
        for user, code, message in answers))


def describe_with_records(store: ScramCredentials, rb: entities.ResponseBuilder, r) -> bytes:
    """For brokers only (the controller listener admits cluster principals): each found user's
    credential records, as JSON in `error_message` (`broker.security.scram_credentials` reads them)."""
    users = None if r.users is None else [str(u.name) for u in r.users]
    out = []
    for res in store.describe(users):
        message = res.error_message
        if res.error_code == ErrorCode.NONE:
            message = json.dumps([credential_record(res.user, m, c) for m in ScramMechanism
                                  if (c := store.lookup(res.user, m)) is not None])
        out.append(rb("DescribeUserScramCredentialsResult", user=res.user, error_code=res.error_code,
                      error_message=message, credential_infos=tuple(
                          rb("CredentialInfo", mechanism=m, iterations=i) for m, i in res.credentials)))
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, error_message=None, results=tuple(out))
