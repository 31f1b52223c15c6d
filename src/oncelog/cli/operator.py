"""The operator's commands, in rpk's and kafka-*.sh's conventions (cli/connect.py has what they
share): topic, produce, consume, group, transactions, acl, user, cluster, log."""
from __future__ import annotations

import click


def operator_commands() -> list[click.Command]:
    from oncelog.cli.acl import acl
    from oncelog.cli.cluster_info import cluster
    from oncelog.cli.consume import consume
    from oncelog.cli.group import group
    from oncelog.cli.log_dump import log_group
    from oncelog.cli.produce import produce
    from oncelog.cli.topic import topic
    from oncelog.cli.transactions import transactions
    from oncelog.cli.user import user
    return [topic, produce, consume, group, transactions, acl, user, cluster, log_group]
