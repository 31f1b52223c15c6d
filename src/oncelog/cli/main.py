"""`oncelog`: the command line. Nothing imports this module.

Each subcommand is imported only when it runs (`LazyGroup`): a broker start pays for what serving
needs, `oncelog topic list` for the client, and neither for Spark, `perf` or `verify`. Tests start
hundreds of these processes, so the imports are most of their start-up time."""
from __future__ import annotations

import importlib
import sys

import click

# name -> "module:attribute" of the click command
COMMANDS = {
    "serve": "oncelog.cli.serve:serve",
    "controller": "oncelog.cli.controller_command:controller_command",
    "topic": "oncelog.cli.topic:topic",
    "produce": "oncelog.cli.produce:produce",
    "consume": "oncelog.cli.consume:consume",
    "group": "oncelog.cli.group:group",
    "share-group": "oncelog.cli.share_group:share_group",
    "transactions": "oncelog.cli.transactions:transactions",
    "acl": "oncelog.cli.acl:acl",
    "user": "oncelog.cli.user:user",
    "quota": "oncelog.cli.quota:quota",
    "cluster": "oncelog.cli.cluster_info:cluster",
    "log": "oncelog.cli.log_dump:log_group",
    "admin": "oncelog.cli.admin:admin",
    "perf": "oncelog.cli.perf:perf",
    "verify": "oncelog.cli.verify:verify",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported when they are used (click's documented
    pattern for lazily loaded subcommands)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), target
        return command


@click.group(cls=LazyGroup)
@click.version_option(package_name="oncelog")
@click.option("--bootstrap-server", "-b", default=None, metavar="HOST:PORT",
              help="Brokers to start from, for every command that reaches the cluster (the command's own "
              "--bootstrap-server wins).")
@click.option("--command-config", type=click.Path(dir_okay=False), metavar="FILE",
              help="Kafka client properties for every command that reaches the cluster.")
@click.option("--log-level", default=None, metavar="LEVEL", help="The client's log lines from this level.")
@click.pass_context
def oncelog(ctx: click.Context, bootstrap_server: str | None, command_config: str | None,
            log_level: str | None) -> None:
    """oncelog: a Kafka-compatible log whose reason to exist is exactly-once producing.

    Shell completion (click's): `eval "$(_ONCELOG_COMPLETE=bash_source oncelog)"` in ~/.bashrc
    (zsh_source in ~/.zshrc; fish: `_ONCELOG_COMPLETE=fish_source oncelog | source`)."""
    # read by cli/connect.py's connection_options (these names are its GLOBAL_* constants; not
    # imported from there, so that `oncelog serve` does not import the client)
    ctx.meta["oncelog.bootstrap_server"] = bootstrap_server
    ctx.meta["oncelog.command_config"] = command_config
    ctx.meta["oncelog.log_level"] = log_level


def main() -> None:
    """Errors as one line on stderr, "oncelog: <what went wrong>", with the command's exit code
    (cli/connect.py lists them); click's usage errors too, with where to read the help."""
    try:
        code = oncelog.main(prog_name="oncelog", standalone_mode=False)
    except click.UsageError as e:
        where = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
        click.echo(f"oncelog: {e.format_message().rstrip('.')}{where}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"oncelog: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
