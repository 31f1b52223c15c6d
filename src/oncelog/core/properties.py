"""Java .properties text as Kafka's tools read it (server.properties, a client's
--command-config): `key=value` or `key: value`, `#` and `!` comments, surrounding blanks dropped,
and java.util.Properties' continuation lines: a line ending in an odd number of backslashes goes
on with the next one, whose leading blanks are dropped. Kafka's documentation splits a
`sasl.jaas.config` so; read line by line, its second line became a setting named `username`."""
from __future__ import annotations

from collections.abc import Iterator

from oncelog.core.topic_config import ConfigError


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, the line with its continuations joined), as Properties.load joins them."""
    joined: list[str] = []
    start = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        part = line.lstrip() if joined else line
        if not joined:
            start = lineno
            if not part.strip() or part.lstrip()[0] in "#!":   # a comment never continues
                yield lineno, part
                continue
        trailing = len(part) - len(part.rstrip("\\"))
        if trailing % 2 == 1:
            joined.append(part[:-1])
            continue
        joined.append(part)
        yield start, "".join(joined)
        joined = []
    if joined:   # a backslash on the last line: Java drops it
        yield start, "".join(joined)


def parse_properties(text: str, source: str) -> dict[str, str]:
    """`source` names the text in errors (a file's path)."""
    out: dict[str, str] = {}
    for lineno, line in _logical_lines(text):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        for sep in ("=", ":"):
            if sep in line:
                key, _, value = line.partition(sep)
                out[key.strip()] = value.strip()
                break
        else:
            raise ConfigError(f"{source}:{lineno}: expected key=value, got {line!r}")
    return out
