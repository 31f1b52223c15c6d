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
from typing import NamedTuple, Protocol

from oncelog.broker.cluster.controller_client import ControllerUnavailable
from oncelog.broker.handlers import APIS, api_versions
from oncelog.broker.net.later import Later
from oncelog.broker.net.request_context import CLIENT, LISTENER, MUTE, PRINCIPAL
from oncelog.broker.services import BrokerServices
from oncelog.core.security.principal import ANONYMOUS, KafkaPrincipal
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey, api_name
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.fetch import OpaqueRecords
from oncelog.protocol.headers import RequestHeader, correlation_id_of, read_request_header, response_header
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
                     listener: str = "", mute: Callable[[int], None] | None = None) -> Response | Later | None:
        """The framed response to one request, or None when it gets none (Produce with acks=0),
        or a `Later` of it (a Produce waiting for its fsync); raises BadRequest for bytes that
        make no request this broker serves."""
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
        try:
            request = api.decode(version, frame[header.body_offset:])
        except _MALFORMED as e:
            raise BadRequest(f"malformed {api_name(api_key)} v{version} request "
                             f"(correlation id {header.correlation_id}): {e}") from None
        CLIENT.set((header.client_id, peer))
        MUTE.set(mute)
        PRINCIPAL.set(principal)
        LISTENER.set(listener)
        quotas = self._services.quotas
        try:
            handling = api.handle(self._services, version, request)
            body: Response | Later | _Refused | None = await (
                quotas.handle_timed(handling) if quotas.request.overrides else handling)
        except Exception as e:  # noqa: BLE001 - the one boundary: every exception gets an answer
            body = self._refused(header, request, peer, e)
        if isinstance(body, Later):
            # what is left is its answer (an acks=all Produce waiting for its fsync)
            out = Later()

            def answer(later: Later) -> None:
                try:
                    done: Response | _Refused | None
                    try:
                        done = later.result()
                    except Exception as e:  # noqa: BLE001 - answered as any handler's exception
                        done = self._refused(header, request, peer, e)
                    response = self._answer(header, len(frame), done, started)
                except Exception as e:  # noqa: BLE001 - the connection closes on it, logged
                    out.fail(e)
                    return
                out.resolve(response)
            body.on_done(answer)
            return out
        return self._answer(header, len(frame), body, started)

    def _refused(self, header: RequestHeader, request: object, peer: str, e: Exception) -> _Refused:
        """The answer to a request its handler raised on: a `KafkaProtocolError`'s code for the
        whole request; NOT_CONTROLLER when the controller could not be reached; else a bug,
        logged, UNKNOWN_SERVER_ERROR."""
        api_key, version = header.api_key, header.api_version
        api = APIS[api_key]
        bug = False
        if isinstance(e, KafkaProtocolError):
            log.info("%s v%d from %s refused: %s", api_name(api_key), version, peer or "?", e)
            code = e.code
        elif isinstance(e, ControllerUnavailable):
            # a request the broker forwards (ACLs, quotas, features) while the controller restarts
            # or cannot be reached: retriable, not a bug (the client asks again)
            log.warning("%s v%d from %s: the controller is not reachable (%s); answered NOT_CONTROLLER",
                        api_name(api_key), version, peer or "?", e)
            code = ErrorCode.NOT_CONTROLLER
        else:
            log.error("%s %s v%d (correlation id %d, client %r at %s); answered UNKNOWN_SERVER_ERROR",
                      HANDLER_BUG, api_name(api_key), version, header.correlation_id, header.client_id,
                      peer or "?", exc_info=e)
            bug = True
            code = ErrorCode.UNKNOWN_SERVER_ERROR
        return _Refused(api.error_response(version, request, code), code, bug)

    def _answer(self, header: RequestHeader, request_bytes: int, body: Response | _Refused | None,
                started: float) -> Response | None:
        """The framed answer, observed."""
        refused: int = ErrorCode.NONE
        bug = False
        if isinstance(body, _Refused):
            body, refused, bug = body
        response = None if body is None else _framed(
            response_header(header.api_key, header.api_version, header.correlation_id), body)
        self._observer.request_handled(header.api_key, header.api_version, request_bytes, body,
                                       response_size(response), refused, bug, time.perf_counter() - started)
        return response


class _Refused(NamedTuple):
    body: Response | None
    code: int
    bug: bool


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
