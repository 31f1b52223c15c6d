"""The one error boundary between the wire and the handlers (h11 keeps one too): a frame in, its
framed answer out.

Bytes that do not make a request this broker serves raise `BadRequest` (the client's fault: the
connection closes); once a request is decoded, whatever its handler raises is oncelog's: a
`KafkaProtocolError` refuses the whole request with its code, anything else is a handler bug,
logged as one (`HANDLER_BUG`) and answered UNKNOWN_SERVER_ERROR in the response the request
expects. What a request cost and how it ended goes to one observer (`BrokerMetrics.request_handled`).
"""
from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import Protocol

from oncelog.broker.cluster.controller_client import ControllerUnavailable
from oncelog.broker.handlers import APIS, api_versions
from oncelog.broker.net.request_context import APPLIED, CLIENT, LISTENER, MUTE, PRINCIPAL
from oncelog.broker.services import BrokerServices
from oncelog.core.security.principal import ANONYMOUS, KafkaPrincipal
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey, api_name
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.fetch import OpaqueRecords
from oncelog.protocol.headers import correlation_id_of, read_request_header, response_header
from oncelog.protocol.primitives import I32

log = logging.getLogger("oncelog.broker")


class BadRequest(Exception):
    """The request cannot be answered in its own format; the connection is closed."""


# A framed answer: bytes, or (a Fetch's) bytes with record sets the connection sends unread
# between them (`protocol.fetch.OpaqueRecords`: regions of log files, `storage.segment.FileRegion`).
Parts = list[bytes | OpaqueRecords]
Response = bytes | Parts


class RequestObserver(Protocol):
    def request_handled(self, api_key: int, version: int, request_bytes: int, body: Response | None,
                        response_bytes: int, refused: int, bug: bool, seconds: float) -> None: ...


class Dispatcher:
    """Decodes a frame, runs its API's handler with the broker's services, frames the answer."""

    def __init__(self, services: BrokerServices, observer: RequestObserver) -> None:
        self._services = services
        self._observer = observer

    async def handle(self, frame: memoryview, peer: str = "", principal: KafkaPrincipal = ANONYMOUS,
                     listener: str = "", mute: Callable[[int], None] | None = None,
                     applied: Callable[[], None] | None = None) -> Response | None:
        """The framed response to one request, or None when it gets none (Produce with acks=0);
        raises BadRequest for bytes that make no request this broker serves."""
        try:
            header = read_request_header(frame)
        except _MALFORMED as e:
            raise BadRequest(f"unreadable request header (correlation id "
                             f"{correlation_id_of(frame)}): {e}") from None
        api_key, version = header.api_key, header.api_version
        api = APIS.get(api_key)
        supported = BROKER_VERSIONS.get(api_key)
        if api is None or supported is None:
            raise BadRequest(f"unknown API key {api_key} from client {header.client_id!r}")
        if not supported[0] <= version <= supported[1]:
            if api_key == ApiKey.API_VERSIONS:
                return _framed(I32.pack(header.correlation_id), api_versions.unsupported_version())
            raise BadRequest(f"{api_name(api_key)} v{version} is not supported "
                             f"(this broker serves v{supported[0]}-v{supported[1]})")
        started = time.perf_counter()
        refused: int = ErrorCode.NONE
        bug = False
        try:
            request = api.decode(version, frame[header.body_offset:])
        except _MALFORMED as e:
            raise BadRequest(f"malformed {api_name(api_key)} v{version} request "
                             f"(correlation id {header.correlation_id}): {e}") from None
        CLIENT.set((header.client_id, peer))
        MUTE.set(mute)
        APPLIED.set(applied)
        PRINCIPAL.set(principal)
        LISTENER.set(listener)
        quotas = self._services.quotas
        try:
            handling = api.handle(self._services, version, request)
            body = await (quotas.handle_timed(handling) if quotas.request.overrides else handling)
        except KafkaProtocolError as e:
            log.info("%s v%d from %s refused: %s", api_name(api_key), version, peer or "?", e)
            refused = e.code
            body = api.error_response(version, request, e.code)
        except ControllerUnavailable as e:
            # a request the broker forwards (ACLs, quotas, features) while the controller restarts
            # or cannot be reached: retriable, not a bug (the client asks again)
            log.warning("%s v%d from %s: the controller is not reachable (%s); answered NOT_CONTROLLER",
                        api_name(api_key), version, peer or "?", e)
            refused = ErrorCode.NOT_CONTROLLER
            body = api.error_response(version, request, refused)
        except Exception:
            log.exception("%s %s v%d (correlation id %d, client %r at %s); answered UNKNOWN_SERVER_ERROR",
                          HANDLER_BUG, api_name(api_key), version, header.correlation_id, header.client_id,
                          peer or "?")
            bug = True
            refused = ErrorCode.UNKNOWN_SERVER_ERROR
            body = api.error_response(version, request, refused)
        response = None if body is None else _framed(
            response_header(api_key, version, header.correlation_id), body)
        self._observer.request_handled(api_key, version, len(frame), body, response_size(response),
                                       refused, bug, time.perf_counter() - started)
        return response


# What a handler bug's log line starts with: tests fail when a broker logged one
# (tests/conftest.py, oncelog.testing.handler_bugs).
HANDLER_BUG = "handler bug in"

# What a decoder raises on bytes that do not make the request they claim to be.
_MALFORMED = (ValueError, IndexError, TypeError, UnicodeDecodeError, EOFError, OverflowError, struct.error)


def _framed(header: bytes, body: Response) -> Response:
    if isinstance(body, bytes):
        return b"".join((I32.pack(len(header) + len(body)), header, body))
    size = len(header) + sum(len(p) for p in body)
    head = body[0]   # encode_response_parts starts with bytes
    assert isinstance(head, bytes)
    return [b"".join((I32.pack(size), header, head)), *body[1:]]


def response_size(response: Response | None) -> int:
    if response is None:
        return 0
    if isinstance(response, bytes):
        return len(response)
    return sum(len(p) for p in response)
