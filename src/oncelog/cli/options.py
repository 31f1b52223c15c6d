"""Options that more than one command takes."""
from __future__ import annotations

import click


def overrides(ctx, param, values) -> dict[str, str]:
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not name=value", ctx=ctx, param=param)
        out[name.strip()] = value.strip()
    return out
