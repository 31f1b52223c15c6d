"""`oncelog verify`: prove under faults that nothing is lost, duplicated or reordered."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from oncelog.testing.faults import ALL_FAULTS, KNOWN_FAULTS
from oncelog.testing.workloads import WORKLOADS


def _names(allowed):
    """A comma-separated list, where 'all' stands for every name (so 'all,power-loss' is all of
    them) and 'none' for none; VerifyOptions says which names are unknown."""
    def parse(ctx, param, value: str) -> tuple[str, ...]:
        names: list[str] = []
        for n in (n.strip() for n in value.split(",")):
            for name in (allowed if n == "all" else () if n in ("", "none") else (n,)):
                if name not in names:
                    names.append(name)
        return tuple(names)
    return parse


@click.command("verify")
@click.option("--faults", default="all", show_default=True, callback=_names(ALL_FAULTS),
              help=f"Comma-separated, from {','.join(KNOWN_FAULTS)}; 'all' (every one but late-endtxn, "
                   "which makes Transactions V1 clients fail by design) or 'none'.")
@click.option("--power-loss", "power_loss", is_flag=True,
              help="Add the power-loss fault: kill every process, cut each segment to its last fsync, restart.")
@click.option("--records", default=10_000, show_default=True, help="Records in total, shared by the clients.")
@click.option("--clients", default=",".join(WORKLOADS), show_default=True, callback=_names(tuple(WORKLOADS)),
              help="Producers that write concurrently.")
@click.option("--workload", type=click.Choice(["produce", "transactions", "share"]), default="produce",
              show_default=True, help="produce: idempotent producers write unique values. transactions: "
              "consume-transform-produce copy loops (oncelog, librdkafka) with aborts and zombie fencing; "
              "the output must hold every input exactly once and no aborted record. share: members of a "
              "share group (oncelog, librdkafka) accept, release, reject and crash holding records; every "
              "record must finish, none be delivered again once acknowledged, none past its delivery limit.")
@click.option("--share-dlq", "share_dlq", is_flag=True,
              help="share workload: the group has a dead-letter topic (KIP-1191, share.version 2); every record "
                   "rejected or archived at the delivery limit must be in it exactly once.")
@click.option("--seed", default=0, show_default=True, help="Same seed, same fault schedule.")
@click.option("--brokers", default=2, show_default=True)
@click.option("--partitions", default=4, show_default=True)
@click.option("--duration", type=float, default=None,
              help="Spread the records over this many seconds (0: as fast as possible). "
                   "Default: 8 s per process fault, at least 10 s.")
@click.option("--timeout", default=120.0, show_default=True,
              help="Each client's delivery timeout, seconds; a client still busy this long after the "
                   "last record is reported as stuck.")
@click.option("--security-protocol", type=click.Choice(["PLAINTEXT", "SASL_SSL"]), default="PLAINTEXT",
              show_default=True, help="SASL_SSL: brokers listen with TLS and SCRAM-SHA-512 (key material made "
              "with openssl in the work directory), every client connects that way, the proxies pass TLS "
              "through (faulting per TLS record).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the JSON summary here.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Keep data and logs here (default: a "
              "temporary directory, removed afterwards).")
def verify(faults, power_loss, records, clients, workload, share_dlq, seed, brokers, partitions, duration, timeout,
           security_protocol, json_path, workdir) -> None:
    """Run producers of several clients against a cluster on this machine while faults run, then
    read every partition and report duplicates, lost acknowledged writes, inconsistent offsets,
    reordering and fatal client errors. Exits 1 if the brokers broke a promise.

    Storage faults use the broker's storage failpoints (ONCELOG_FAILPOINTS): fsync (EIO on an fsync
    after the write), shortwrite (a write cut short by a full disk), power-loss (everything not
    fsynced is lost)."""
    from oncelog.testing.verify import VerifyOptions, render, run
    logging.basicConfig(level=logging.WARNING)
    if power_loss and "power-loss" not in faults:
        faults = (*faults, "power-loss")
    source = click.get_current_context().get_parameter_source("clients")
    if workload != "produce" and source == click.core.ParameterSource.DEFAULT:
        # the default names the producers; the other workloads run the clients that have them
        from oncelog.testing.share_verify import SHARE_CLIENTS
        from oncelog.testing.txn_verify import TXN_CLIENTS
        clients = SHARE_CLIENTS if workload == "share" else TXN_CLIENTS
    try:
        options = VerifyOptions(faults=faults, records=records, clients=clients, seed=seed, brokers=brokers,
                                partitions=partitions, duration_s=duration, timeout_s=timeout,
                                security_protocol=security_protocol,
                                workdir=Path(workdir) if workdir else None, workload=workload, share_dlq=share_dlq)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    result = run(options, progress=lambda msg: click.echo(f"verify: {msg}", err=True))
    click.echo(render(result))
    if json_path:
        Path(json_path).write_text(json.dumps(result.to_json(), indent=2))
    raise SystemExit(0 if result.ok else 1)
