"""The `oncelog` command tree, read from click in a process of its own (tests import nothing of
oncelog.cli, the composition root: tests/conftest.py refuses it), for the docs tests.

    python tests/docs/cli_tree.py < requests.json > answers.json

The request is a JSON object: {"parse": [argv, ...]}. The answer: {"tree": {"topic list": {"options":
[...], "commands": [...]}, ...}, "parse": [null or the error click gives for that argv, ...]}.
One process answers everything a test module asks: an `oncelog --help` costs about a second of
CPU, and the tree has over sixty commands.

Parsing checks what click checks before a command runs (the command and subcommand names, each
option's name, the number and type of values, required options), and runs nothing."""
from __future__ import annotations

import json
import sys

import click

from oncelog.cli.main import oncelog


def tree() -> dict[str, dict]:
    out: dict[str, dict] = {}

    def walk(command: click.Command, path: str, ctx: click.Context) -> None:
        options = sorted(opt for p in command.params if isinstance(p, click.Option)
                         for opt in (*p.opts, *p.secondary_opts))
        subcommands: list[str] = []
        if isinstance(command, click.Group):
            subcommands = command.list_commands(ctx)
        out[path] = {"options": options, "commands": subcommands,
                     "help": (command.help or "").strip().split("\n")[0]}
        for name in subcommands:
            sub = command.get_command(ctx, name)  # type: ignore[union-attr]
            assert sub is not None, (path, name)
            walk(sub, f"{path} {name}".strip(), click.Context(sub, info_name=name, parent=ctx))

    walk(oncelog, "", click.Context(oncelog, info_name="oncelog"))
    return out


def parse(argv: list[str]) -> str | None:
    """None if click takes `argv` (after `oncelog`), else its error; a missing file named by a
    path option is not an error here (the docs name files of their own, e.g. admin.properties)."""
    command: click.Command = oncelog
    args, parent, name = list(argv), None, "oncelog"
    try:
        while True:
            ctx = command.make_context(name, args, parent=parent)
            if not isinstance(command, click.Group):
                return None
            rest = [*ctx._protected_args, *ctx.args]
            if not rest:
                return None if command.invoke_without_command else f"{ctx.command_path}: no command"
            name, sub, args = command.resolve_command(ctx, rest)
            assert sub is not None and name is not None
            command, parent = sub, ctx
    except click.BadParameter as e:
        if "does not exist" in e.format_message():
            return None
        return f"{e.ctx.command_path if e.ctx else 'oncelog'}: {e.format_message()}"
    except click.ClickException as e:
        where = getattr(e, "ctx", None)
        return f"{where.command_path if where else 'oncelog'}: {e.format_message()}"
    except SystemExit as e:  # --help, --version
        return None if e.code in (0, None) else f"exit {e.code}"


if __name__ == "__main__":
    request = json.load(sys.stdin)
    json.dump({"tree": tree(), "parse": [parse(a) for a in request.get("parse", [])]}, sys.stdout)
