"""Options that more than one command takes."""
from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import click


def overrides(ctx, param, values) -> dict[str, str]:
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not name=value", ctx=ctx, param=param)
        out[name.strip()] = value.strip()
    return out


DURATION = re.compile(r"-(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def when(value: str, now_ms: int | None = None) -> int | None:
    """A time given as ms since the epoch, `-1h` (`-30m`, `-2d`, `-10s`; before now) or an ISO
    8601 time (`2026-01-31T12:00:00Z`; without a zone, UTC): ms since the epoch, None if
    `value` is none of them."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    m = DURATION.fullmatch(value)
    if m is not None:
        return now - int(m.group(1)) * _UNIT_MS[m.group(2)]
    if value.isdigit():
        return int(value)
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp() * 1000)


_ISO_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?")


def duration_ms(value: str) -> int | None:
    """kafka-consumer-groups' `--by-duration` (ISO 8601: `PT1H`, `P1DT12H`, `PT30M`, `PT10S`) or
    rpk's style (`1h`, `30m`, `2d`, `10s`, `500ms`): milliseconds, None if it is neither."""
    m = _ISO_DURATION.fullmatch(value.upper())
    if m is not None and value.upper() not in ("P", "PT") and any(m.groups()):
        d, h, mi, s = m.groups()
        return (int(d or 0) * 86_400_000 + int(h or 0) * 3_600_000 + int(mi or 0) * 60_000
                + int(float(s or 0) * 1000))
    m = DURATION.fullmatch("-" + value)
    return int(m.group(1)) * _UNIT_MS[m.group(2)] if m is not None else None
