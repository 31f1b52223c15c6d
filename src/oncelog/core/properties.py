"""Java .properties text as Kafka's tools read it (server.properties, a client's
--command-config): `key=value` or `key: value`, `#` and `!` comments, surrounding blanks dropped."""
from __future__ import annotations

from oncelog.core.topic_config import ConfigError


def parse_properties(text: str, source: str) -> dict[str, str]:
    """`source` names the text in errors (a file's path)."""
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
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
