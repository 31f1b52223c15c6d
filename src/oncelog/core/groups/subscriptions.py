"""Subscriptions by regular expression (KIP-848's `SubscribedTopicRegex`, Kafka 4.0): RE2 syntax
matched against whole topic names, as Kafka's RE2J does (`^topic` no longer matches `topic-1`;
`topic.*` does). RE2 runs in time linear in the name, so no pattern a client sends can make the
broker match for long; a pattern RE2 refuses is INVALID_REGULAR_EXPRESSION. Internal topics are
never matched (the caller leaves them out of the names).

Memory: a compiled pattern costs a few times its length (a 20 MB character class took 38 MB), so
the compile cache is bounded by the patterns' total length as well as their number, and a pattern
no member uses any more is dropped from it (`forget`). A pattern's length is bounded before it gets
here by the member record's size limit (`heartbeat.Settings.max_record_bytes`)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import re2

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a client's bad pattern is its answer, not a line on the broker's stderr

CACHE_PATTERNS = 256              # compiled patterns kept at most
CACHE_PATTERN_CHARS = 4 << 20     # and at most this many characters of pattern among them


class _CompileCache:
    """Least recently used compiled patterns, bounded by count and by total pattern length."""

    def __init__(self, max_patterns: int, max_chars: int) -> None:
        self.max_patterns, self.max_chars = max_patterns, max_chars
        self.entries: OrderedDict[str, Any] = OrderedDict()
        self.chars = 0

    def get(self, pattern: str) -> Any:
        compiled = self.entries.get(pattern)
        if compiled is not None:
            self.entries.move_to_end(pattern)
            return compiled
        compiled = _compile(pattern)
        if len(pattern) > self.max_chars:
            return compiled          # used once, never kept
        self.entries[pattern] = compiled
        self.chars += len(pattern)
        while len(self.entries) > self.max_patterns or self.chars > self.max_chars:
            self.drop(next(iter(self.entries)))
        return compiled

    def drop(self, pattern: str) -> None:
        if self.entries.pop(pattern, None) is not None:
            self.chars -= len(pattern)


_CACHE = _CompileCache(CACHE_PATTERNS, CACHE_PATTERN_CHARS)


def _compile(pattern: str) -> Any:
    try:
        # not re2.compile: it keeps the last 128 patterns compiled in a cache of its own
        # (functools.lru_cache on _Regexp._make), whatever their size, out of this module's reach
        return re2._Regexp(pattern, _OPTIONS)
    except re2.error as e:
        reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise KafkaProtocolError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                                 f"SubscribedTopicRegex {_shown(pattern)} is not a valid regular expression: "
                                 f"{reason[:200]}"
                                 ) from None


def _shown(pattern: str) -> str:
    """The pattern as an error message quotes it: a long one cut (the answer is not a megabyte)."""
    return repr(pattern) if len(pattern) <= 100 else f"{pattern[:100]!r}... ({len(pattern)} characters)"


def compile_regex(pattern: str) -> Any:
    return _CACHE.get(pattern)


def forget(pattern: str) -> None:
    """No member uses `pattern` any more: its compiled form goes."""
    _CACHE.drop(pattern)


def cached_patterns() -> list[str]:
    """The patterns compiled and kept (for tests and the resource bounds' checks)."""
    return list(_CACHE.entries)


def resolve(pattern: str, names: Iterable[str]) -> frozenset[str]:
    compiled = compile_regex(pattern)
    return frozenset(n for n in names if compiled.fullmatch(n) is not None)
