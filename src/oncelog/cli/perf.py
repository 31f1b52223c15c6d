"""`oncelog perf produce`: kafka-producer-perf-test's flags and final line, for the oncelog producer
(the test itself is `oncelog.testing.perf`)."""
from __future__ import annotations

import click

from oncelog.client.errors import KafkaClientError
from oncelog.testing.perf import PerfError, run_produce


def parse_props(props) -> dict:
    out = {}
    for p in props:
        if "=" not in p:
            raise click.BadParameter(f"expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


@click.group("perf")
def perf() -> None:
    """Performance tests (kafka-*-perf-test compatible)."""


@perf.command("produce", context_settings={"ignore_unknown_options": True})
@click.option("--topic", required=True)
@click.option("--num-records", type=int, required=True)
@click.option("--record-size", type=int, default=None)
@click.option("--payload-file", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--throughput", type=float, required=True, help="records/sec cap; -1 for none")
@click.option("--producer-props", "--command-property", "producer_props", multiple=True,
              help="k=v ... producer settings (--command-property: KIP-1147's name)")
@click.option("--producer.config", "--command-config", "producer_config", type=click.Path(exists=True),
              default=None, help="producer properties file (--command-config: KIP-1147's name)")
@click.option("--bootstrap-server", default=None)
@click.option("--transactional-id", default=None,
              help="produce in transactions with this transactional.id (takes precedence over "
                   "transactional.id in the properties)")
@click.option("--transaction-duration-ms", type=int, default=None,
              help="commit a transaction once it is this old; turns transactions on (default "
                   "3000 when a transactional id is given; the id then defaults to "
                   "performance-producer-<uuid>)")
@click.option("--proxy-latency-ms", type=float, default=0.0,
              help="route through a delay proxy adding this round-trip time")
@click.option("--no-progress", is_flag=True)
@click.argument("more_props", nargs=-1)
def produce(topic, num_records, record_size, payload_file, throughput, producer_props,
            producer_config, bootstrap_server, transactional_id, transaction_duration_ms,
            proxy_latency_ms, no_progress, more_props):
    """Like kafka-producer-perf-test: --topic T --num-records N --record-size S --throughput -1
    --producer-props bootstrap.servers=HOST:PORT acks=all ..."""
    props: dict = {}
    if producer_config:
        with open(producer_config) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    props[k.strip()] = v.strip()
    # kafka-producer-perf-test takes `--producer-props k=v k=v ...`: the values after the first
    # arrive here as extra arguments
    props.update(parse_props(_split(producer_props) + list(more_props)))
    # the command's own, else the one before the command (`oncelog -b HOST:PORT perf produce`)
    bootstrap_server = bootstrap_server or click.get_current_context().meta.get("oncelog.bootstrap_server")
    if bootstrap_server:
        props["bootstrap.servers"] = bootstrap_server
    if "bootstrap.servers" not in props:
        raise click.UsageError("give bootstrap.servers in --producer-props or --bootstrap-server")
    payload = None
    if payload_file:
        with open(payload_file, "rb") as f:
            payload = f.read().split(b"\n")[0]
        record_size = len(payload)
    if record_size is None:
        raise click.UsageError("--record-size or --payload-file is required")
    if transaction_duration_ms is not None and transaction_duration_ms <= 0:
        raise click.BadParameter("should be greater than zero", param_hint="--transaction-duration-ms")
    try:
        r = run_produce(topic, num_records, record_size, throughput, props,
                        proxy_latency_ms=proxy_latency_ms, progress=not no_progress, payload=payload,
                        transactional_id=transactional_id,
                        transaction_duration_ms=transaction_duration_ms)
    except PerfError as e:
        if e.figures is not None:
            click.echo(e.figures["line"])   # as Kafka's: the records that were delivered
        raise click.ClickException(str(e)) from None
    except KafkaClientError as e:   # e.g. fenced by another producer with the transactional id
        raise click.ClickException(f"{type(e).__name__}: {e}") from None
    click.echo(r["line"])


def _split(values) -> list[str]:
    out = []
    for v in values:
        out.extend(v.split())
    return out


if __name__ == "__main__":  # pragma: no cover
    perf()
