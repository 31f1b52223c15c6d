"""SCRAM credentials live in the controller's metadata log (`controller/scram.py`); the broker
asks for a user's credential when a SCRAM exchange names the user, and forwards
AlterUserScramCredentials / DescribeUserScramCredentials.

The controller answers its DescribeUserScramCredentials (cluster principals only) with, per
user found, the credential records as JSON in the result's `error_message` (an oncelog-internal
use of that field on the controller listener; `controller.scram.describe_with_records`). The
broker never passes that text on: its own answer to clients is rebuilt from mechanisms and
iterations. One round trip per login keeps every broker exactly as current as the controller (a
deleted credential stops working at once) without a second copy of the records to keep in step.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from oncelog.broker.cluster.controller_client import ControllerClient, ControllerUnavailable, controller_client
from oncelog.core.security.credentials import ScramCredentials
from oncelog.core.security.scram import CredentialShape, ScramCredential, ScramMechanism
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import KafkaProtocolError

log = logging.getLogger("oncelog.broker.scram")


class CredentialsUnavailable(Exception):
    """The controller could not be asked and no earlier answer is known: the login can be neither
    accepted nor refused (the connection is closed, so the client retries as after a network
    error instead of treating it as a wrong password)."""


class ControllerCredentials:
    """Each lookup asks the controller; its last answer per user is kept for when the controller
    cannot be reached (a restarting controller does not lock every client out)."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker
        self._client: ControllerClient | None = None
        self._last: dict[tuple[str, ScramMechanism], ScramCredential | None] = {}

    def client(self) -> ControllerClient:
        if self._client is None:
            self._client = controller_client(self._broker.config, client_id="oncelog-broker-scram")
        return self._client

    async def lookup(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        """The stored credential, or None for a user without one. Raises CredentialsUnavailable."""
        key = (user, mechanism)
        try:
            r = await self.client().request(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0,
                                            users=(entities.make(entities.nested(
                                                ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, "request", "UserName"),
                                                name=user),))
        except (ControllerUnavailable, KafkaProtocolError, entities.MalformedResponse) as e:
            if key in self._last:
                log.info("SCRAM credential of %r from the last answer: the controller is unreachable (%s)", user, e)
                return self._last[key]
            raise CredentialsUnavailable(f"the controller is unreachable: {e}") from None
        found = None
        for result in r.results:
            if str(result.user) == user and int(result.error_code) == 0 and result.error_message:
                found = ScramCredentials.from_snapshot(json.loads(result.error_message)).lookup(user, mechanism)
        if len(self._last) > 10000:   # bounded: names come from clients
            self._last.clear()
        self._last[key] = found
        return found

    def shapes(self, mechanism: ScramMechanism) -> Mapping[CredentialShape, int]:
        """The shapes of the credentials this broker follows (`security_follower`): what the SCRAM
        mock for a user that does not exist imitates."""
        try:
            security = self._broker.security
        except RuntimeError:  # BrokerNotStarted: no security follower yet, nothing to imitate
            return {}
        return security.state.scram.shapes(mechanism)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
