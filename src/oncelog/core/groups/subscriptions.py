"""Subscriptions by regular expression (KIP-848's `SubscribedTopicRegex`, Kafka 4.0): RE2 syntax
matched against whole topic names, as Kafka's RE2J does (`^topic` no longer matches `topic-1`;
`topic.*` does). RE2 runs in time linear in the name, so no pattern a client sends can make the
broker match for long; a pattern RE2 refuses is INVALID_REGULAR_EXPRESSION. Internal topics are
never matched (the caller leaves them out of the names)."""
from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import re2

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a client's bad pattern is its answer, not a line on the broker's stderr


@lru_cache(maxsize=256)
def compile_regex(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as e:
        reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise KafkaProtocolError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                                 f"SubscribedTopicRegex {pattern!r} is not a valid regular expression: {reason}"
                                 ) from None


def resolve(pattern: str, names: Iterable[str]) -> frozenset[str]:
    compiled = compile_regex(pattern)
    return frozenset(n for n in names if compiled.fullmatch(n) is not None)
