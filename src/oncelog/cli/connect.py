"""What the operator's commands share (`oncelog topic|produce|consume|group|transactions|acl|user|
cluster`): how they reach the cluster, how they print, and how a failure becomes one line and an
exit code.

Reaching the cluster, as kafka-*.sh and rpk do: `--bootstrap-server HOST:PORT[,...]` (default
$ONCELOG_BOOTSTRAP_SERVER, else 127.0.0.1:9092) and `--command-config FILE`, a Kafka client
properties file (security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.location
with PEM files; `oncelog.client.properties` translates the Java names).

Exit codes (docs/operations.md, "Exit codes"):
    0  done
    1  the cluster refused, or what was named does not exist
    2  bad usage: an unknown option, a malformed value, an unreadable --command-config
    3  the cluster cannot be reached (refused, timed out, unknown host)
    4  authentication failed (SASL credentials, TLS certificates)
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import click

from oncelog.client.aio.connection import AuthenticationError, BrokerConnectionError
from oncelog.client.errors import ConfigError, KafkaClientError

BOOTSTRAP_ENV = "ONCELOG_BOOTSTRAP_SERVER"
# where main.py keeps the connection options given before the command (click's Context.meta,
# shared by a context and its children)
GLOBAL_BOOTSTRAP = "oncelog.bootstrap_server"
GLOBAL_COMMAND_CONFIG = "oncelog.command_config"
GLOBAL_LOG_LEVEL = "oncelog.log_level"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
REFUSED, USAGE, UNREACHABLE, AUTHENTICATION = 1, 2, 3, 4
# a command waits this long for an answer unless --command-config says request.timeout.ms
DEFAULT_TIMEOUT_MS = 15000


class CommandError(click.ClickException):
    """One line on stderr ("oncelog: <message>") and `exit_code`."""

    def __init__(self, message: str, exit_code: int = REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it a class constant; ours vary


@dataclass
class Target:
    """Where a command goes and with which client settings."""
    bootstrap: str
    settings: dict[str, Any] = field(default_factory=dict)

    def config(self, **extra: Any) -> dict[str, Any]:
        return {"request.timeout.ms": DEFAULT_TIMEOUT_MS, **self.settings, **extra,
                "bootstrap.servers": self.bootstrap}


def _target(bootstrap_server: str | None, command_config: str | None) -> Target:
    settings: dict[str, Any] = {}
    if command_config:
        from oncelog.client.config_keys import ANY, unknown_message
        from oncelog.client.properties import read_client_properties
        try:
            settings = dict(read_client_properties(command_config))
        except ConfigError as e:
            raise CommandError(f"--command-config: {e}", USAGE) from None
        for key in settings:
            if key not in ANY:   # a typo would otherwise do nothing, silently
                raise CommandError(f"--command-config {command_config}: {unknown_message(key)}", USAGE)
    in_file = settings.pop("bootstrap.servers", None)
    return Target(bootstrap_server or in_file or DEFAULT_BOOTSTRAP, settings)


def _client_logs(level: str | None) -> None:
    """The client library's log lines go to stderr only when asked for: the error a command
    reports is its own one line."""
    import logging
    if level is None:
        quiet = logging.getLogger("oncelog")
        quiet.addHandler(logging.NullHandler())   # a handler, so Python's "last resort" one prints nothing
        quiet.propagate = False
        return
    from oncelog.cli import logs
    try:
        logs.configure(level)
    except ValueError:
        raise CommandError(f"--log-level {level!r}: one of DEBUG, INFO, WARNING, ERROR", USAGE) from None


def connection_options(f: Callable) -> Callable:
    """`--bootstrap-server` and `--command-config`, handed to the command as `target: Target`."""
    @functools.wraps(f)
    def wrapper(*args, bootstrap_server, command_config, log_level, **kwargs):
        # given after the command, else before it (`oncelog --bootstrap-server X topic list`, as
        # rpk's flags go anywhere; main.py keeps them in the context's meta), else the environment
        meta = click.get_current_context().meta
        bootstrap_server = (bootstrap_server or meta.get(GLOBAL_BOOTSTRAP)
                            or os.environ.get(BOOTSTRAP_ENV) or None)
        command_config = command_config or meta.get(GLOBAL_COMMAND_CONFIG)
        _client_logs(log_level or meta.get(GLOBAL_LOG_LEVEL))
        return f(*args, target=_target(bootstrap_server, command_config), **kwargs)
    wrapper = click.option("--log-level", default=None, metavar="LEVEL",
                           help="Show the client's log lines from this level (DEBUG, INFO, WARNING); by default "
                           "a command prints only its result or its one-line error.")(wrapper)
    wrapper = click.option("--command-config", type=click.Path(dir_okay=False), metavar="FILE",
                           help="Kafka client properties (security.protocol, sasl.mechanism, sasl.jaas.config, "
                           "ssl.truststore.location, ...), as kafka-*.sh take them.")(wrapper)
    return click.option("--bootstrap-server", "-b", default=None, metavar="HOST:PORT",
                        help=f"Brokers to start from (also before the command; default ${BOOTSTRAP_ENV}, "
                        f"else {DEFAULT_BOOTSTRAP}).")(wrapper)


def admin_client(target: Target):
    """An AIOAdminClient for `target` (use with `async with`)."""
    from oncelog.client.aio.admin import AIOAdminClient
    return AIOAdminClient(target.config(**{"client.id": "oncelog-cli"}))


def format_option(f: Callable) -> Callable:
    return click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
                        help="text: a table; json: one JSON document (see docs/operations.md for the shapes).")(f)


@contextlib.contextmanager
def reporting(target: Target) -> Iterator[None]:
    """A client failure inside becomes a CommandError with its exit code."""
    try:
        yield
    except BrokenPipeError:   # our own output closed (`| head`): the caller's business, not the cluster's
        raise
    except AuthenticationError as e:
        raise CommandError(f"authentication with {target.bootstrap} failed: {e}", AUTHENTICATION) from None
    except (BrokerConnectionError, ConnectionError, TimeoutError) as e:
        raise CommandError(f"cannot reach {target.bootstrap}: {_reason(e)}", UNREACHABLE) from None
    except ConfigError as e:
        raise CommandError(str(e), USAGE) from None
    except KafkaClientError as e:
        raise CommandError(str(e), REFUSED) from None


def run(target: Target, coro: Coroutine) -> Any:
    """Run a command's coroutine (`reporting` its failures)."""
    with reporting(target):
        return asyncio.run(coro)


def _reason(e: BaseException) -> str:
    text = str(e)
    for marker, reason in (("ConnectionRefused", "connection refused (is a broker running there?)"),
                           ("gaierror", "unknown host"), ("TimeoutError", "no answer in time"),
                           ("Errno 113", "no route to host")):
        if marker in text:
            return reason
    return text or type(e).__name__


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def print_table(columns: list[str], rows: list[list[Any]]) -> None:
    """Aligned columns without borders (rpk's style), never wrapped when piped."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    table = Table(*columns, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console(width=None if sys.stdout.isatty() else 100_000, soft_wrap=True).print(table)


def parse_assignments(values: tuple[str, ...], what: str) -> dict[str, str]:
    """`k=v` pairs of a repeatable option; a malformed one is a usage error naming it."""
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CommandError(f"{what} {item!r}: expected NAME=VALUE", USAGE)
        out[name.strip()] = value.strip()
    return out


def interactive() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
