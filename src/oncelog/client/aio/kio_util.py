"""Build kio entities for whichever version was negotiated: each version is its own generated
module, and fields a version lacks are dropped (Kafka's "ignorable" rule, done on our side)."""
from __future__ import annotations

import dataclasses
import datetime
import importlib
from functools import lru_cache

from oncelog.client.aio import wire
from oncelog.client.errors import KafkaClientError

_MODULES = {wire.FETCH: "fetch", wire.LIST_OFFSETS: "list_offsets", wire.CREATE_TOPICS: "create_topics",
            wire.DELETE_TOPICS: "delete_topics", wire.DESCRIBE_CONFIGS: "describe_configs",
            wire.INCREMENTAL_ALTER_CONFIGS: "incremental_alter_configs",
            wire.DELETE_RECORDS: "delete_records", wire.DESCRIBE_PRODUCERS: "describe_producers"}


@lru_cache(maxsize=None)
def module(api_key: int, version: int, kind: str):
    return importlib.import_module(f"kio.schema.{_MODULES[api_key]}.v{version}.{kind}")


@lru_cache(maxsize=None)
def _fields(cls) -> frozenset:
    return frozenset(f.name for f in dataclasses.fields(cls))


def make(mod, cls_name: str, **kwargs):
    cls = getattr(mod, cls_name)
    names = _fields(cls)
    return cls(**{k: v for k, v in kwargs.items() if k in names})


def ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def encode(api_key: int, version: int, cls_name: str, **kwargs) -> bytes:
    return wire.encode_entity(make(module(api_key, version, "request"), cls_name, **kwargs))


def decode(api_key: int, version: int, cls_name: str, body):
    try:
        return wire.decode_entity(getattr(module(api_key, version, "response"), cls_name), bytes(body))
    except ValueError as e:
        # kio reads error codes into its own enum, which raises for a code it lacks
        if "ErrorCode" not in str(e):
            raise
        raise KafkaClientError(f"{cls_name} carries an error code this client does not know "
                               f"({e})") from None
