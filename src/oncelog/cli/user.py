"""`oncelog user`: SCRAM users (`rpk security user`, kafka-configs' --entity-type users): create
(or change the password of), list, delete. The password never goes on the command line (where
every local user can read it): it comes from --password-file, else from stdin (a prompt on a
terminal). The salted password is computed here; the broker stores only what SCRAM needs."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from oncelog.cli.connect import (
    USAGE,
    CommandError,
    Target,
    admin_client,
    connection_options,
    format_option,
    print_json,
    print_table,
    run,
)

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@click.group("user")
def user() -> None:
    """Create, list and delete SCRAM users."""


def _password(password_file: str | None) -> str:
    if password_file:
        try:
            text = Path(password_file).read_text()
        except OSError as e:
            raise CommandError(f"--password-file {password_file}: {e.strerror or e}", USAGE) from None
    elif sys.stdin.isatty():
        text = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    else:
        text = sys.stdin.readline()
    password = text.rstrip("\r\n")
    if not password:
        raise CommandError("empty password", USAGE)
    return password


@user.command("create")
@click.argument("name")
@click.option("--mechanism", type=click.Choice(MECHANISMS, case_sensitive=False), default="SCRAM-SHA-256",
              show_default=True)
@click.option("--iterations", type=click.IntRange(4096), default=4096, show_default=True)
@click.option("--password-file", type=click.Path(dir_okay=False), help="Read the password from this file "
              "(else from stdin).")
@connection_options
def create(name, mechanism, iterations, password_file, target: Target) -> None:
    """Create user NAME, or set a new password for it."""
    password = _password(password_file)

    async def go():
        async with admin_client(target) as admin:
            await admin.upsert_scram_user(name, password, mechanism.upper(), iterations)
    run(target, go())
    click.echo(f"user {name}: {mechanism.upper()} credential set")


@user.command("list")
@format_option
@connection_options
def list_(fmt, target: Target) -> None:
    """Every SCRAM user and its mechanisms."""
    async def go():
        async with admin_client(target) as admin:
            return await admin.describe_scram_users()
    users = run(target, go())
    rows = [{"user": u, "mechanisms": [{"mechanism": m, "iterations": i} for m, i in creds]}
            for u, creds in sorted(users.items())]
    if fmt == "json":
        print_json(rows)
    else:
        print_table(["USER", "MECHANISMS"], [[r["user"], ", ".join(f"{m['mechanism']} ({m['iterations']})"
                                                                   for m in r["mechanisms"])] for r in rows])


@user.command("delete")
@click.argument("name")
@click.option("--mechanism", type=click.Choice(MECHANISMS, case_sensitive=False),
              help="Only this mechanism's credential (default: all the user has).")
@connection_options
def delete(name, mechanism, target: Target) -> None:
    """Delete user NAME's SCRAM credentials."""
    async def go():
        async with admin_client(target) as admin:
            if mechanism:
                mechanisms = [mechanism.upper()]
            else:
                mechanisms = [m for m, _ in (await admin.describe_scram_users([name])).get(name, [])]
            for m in mechanisms:
                await admin.delete_scram_user(name, m)
            return mechanisms
    removed = run(target, go())
    click.echo(f"user {name}: deleted {', '.join(removed)}")
