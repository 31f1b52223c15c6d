"""kio entities by (api key, version): each version is its own generated module.

`make` builds an entity of whatever version was negotiated from one set of keyword arguments:
fields that version lacks are dropped (Kafka's "ignorable" rule) and millisecond integers become
the timedelta/datetime values kio expects, so handlers and client calls are written once for all
versions. Brokers decode requests and build responses with it, clients the reverse.

kio reads an error code into its own enum, which refuses a code it lacks: a response carrying a
code newer than kio fails to decode as a whole (`MalformedResponse`). Responses where that would
hurt (Fetch, Produce, Metadata, InitProducerId, ApiVersions) are decoded by hand in this package,
error codes as integers per field.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import types
import typing
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import DecodeError

from oncelog.protocol import describe_transactions
from oncelog.protocol.api import KIO_NAMES, ApiKey, api_name
from oncelog.protocol.primitives import Buf

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@cache
def module(api_key: int, version: int, kind: str) -> Any:
    """kind: "request" or "response"."""
    return importlib.import_module(f"kio.schema.{KIO_NAMES[api_key]}.v{version}.{kind}")


@cache
def entity_class(api_key: int, version: int, kind: str) -> Any:
    camel = "".join(part.capitalize() for part in KIO_NAMES[api_key].split("_"))
    return getattr(module(api_key, version, kind), camel + kind.capitalize())


@cache
def _fields(cls: Any) -> dict[str, str]:
    return {f.name: f.metadata.get("kafka_type", "") for f in dataclasses.fields(cls)}


def _convert(kafka_type: str, value: Any) -> Any:
    if kafka_type == "error_code":
        return KioErrorCode(int(value))  # kio writes `.value` of its own enum
    if isinstance(value, int) and not isinstance(value, bool):
        if kafka_type in ("timedelta_i32", "timedelta_i64"):
            return datetime.timedelta(milliseconds=value)
        if kafka_type == "datetime_i64":
            return None if value < 0 else _EPOCH + datetime.timedelta(milliseconds=value)
    return value


def make(cls: Any, **kwargs: Any) -> Any:
    names = _fields(cls)
    return cls(**{k: _convert(names[k], v) for k, v in kwargs.items() if k in names})


@cache
def _error_defaults(cls: Any) -> tuple[tuple[str, str, Any], ...]:
    """(name, kafka type, value) for each error code and each field without a default: the value
    an error answer gives it (`make_error`); error codes are filled in there."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kafka_type = f.metadata.get("kafka_type", "")
        if kafka_type != "error_code" and (f.default is not dataclasses.MISSING
                                           or f.default_factory is not dataclasses.MISSING):
            continue
        hint = hints[f.name]
        value: Any
        nullable = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
        if kafka_type == "error_code":
            value = None
        elif nullable:
            value = None
        elif kafka_type in ("timedelta_i32", "timedelta_i64"):
            value = 0
        elif kafka_type.startswith(("int", "uint")) or kafka_type == "float64":
            value = -1
        elif kafka_type == "bool":
            value = False
        elif kafka_type == "string":
            value = ""
        elif kafka_type in ("bytes", "records"):
            value = b""
        else:  # an array
            value = ()
        out.append((f.name, kafka_type, value))
    return tuple(out)


def make_error(cls: Any, code: int, **kwargs: Any) -> Any:
    """`make` for an error answer: fields not given take Kafka's usual values there (error codes
    `code`, numbers -1, strings empty or null, arrays empty, throttle time 0)."""
    for name, kafka_type, value in _error_defaults(cls):
        if name not in kwargs:
            kwargs[name] = code if kafka_type == "error_code" else value
    return make(cls, **kwargs)


def nested(api_key: int, version: int, kind: str, cls_name: str) -> Any:
    return getattr(module(api_key, version, kind), cls_name)


class MalformedRequest(ValueError):
    """The bytes do not decode as the request they claim to be."""


class MalformedResponse(ValueError):
    """The bytes do not decode as the response expected (or carry an error code kio lacks)."""


_DECODE_ERRORS = (DecodeError, ValueError, IndexError, TypeError, OverflowError)
_DESCRIBE_TRANSACTIONS = ApiKey.DESCRIBE_TRANSACTIONS


def decode_request(api_key: int, version: int, body: Buf) -> Any:
    try:
        value, _size = entity_reader(entity_class(api_key, version, "request"))(bytes(body), 0)
    except _DECODE_ERRORS as e:
        raise MalformedRequest(f"{type(e).__name__}: {e}") from None
    return value


def decode_response(api_key: int, version: int, body: Buf) -> Any:
    try:
        if api_key == _DESCRIBE_TRANSACTIONS and version == 0:   # a start time of -1, which kio refuses
            return describe_transactions.decode_response(bytes(body))
        value, _size = entity_reader(entity_class(api_key, version, "response"))(bytes(body), 0)
    except _DECODE_ERRORS as e:
        raise MalformedResponse(f"{api_name(api_key)} v{version} response does not decode: "
                                f"{type(e).__name__}: {e}") from None
    return value


def encode(entity: Any) -> bytes:
    b = io.BytesIO()
    entity_writer(type(entity))(b, entity)
    return b.getvalue()


def millis(value: Any) -> int:
    """A kio timedelta/datetime (or int) back to milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    if isinstance(value, datetime.datetime):
        return int((value - _EPOCH) / datetime.timedelta(milliseconds=1))
    if value is None:
        return -1
    return int(value)


class _Builder:
    """Builds one negotiated version's entities of one kind by class name: `b("Topic", ...)`;
    `encode(...)` builds and encodes the message itself."""

    __slots__ = ("api_key", "version")
    kind = ""

    def __init__(self, api_key: int, version: int) -> None:
        self.api_key, self.version = api_key, version

    def __call__(self, cls_name: str, **kwargs: Any) -> Any:
        return make(nested(self.api_key, self.version, self.kind, cls_name), **kwargs)

    def encode(self, **kwargs: Any) -> bytes:
        return encode(make(entity_class(self.api_key, self.version, self.kind), **kwargs))


class ResponseBuilder(_Builder):
    __slots__ = ()
    kind = "response"

    def error(self, cls_name: str, code: int, **kwargs: Any) -> Any:
        """`rb(cls_name, ...)` for an error answer (`make_error`)."""
        return make_error(nested(self.api_key, self.version, "response", cls_name), code, **kwargs)

    def encode_error(self, code: int, **kwargs: Any) -> bytes:
        """The whole response as an error answer: Kafka's `AbstractRequest.getErrorResponse`
        for requests with a top-level error code; others name their resources in `kwargs`."""
        return encode(make_error(entity_class(self.api_key, self.version, "response"), code, **kwargs))


class RequestBuilder(_Builder):
    __slots__ = ()
    kind = "request"
