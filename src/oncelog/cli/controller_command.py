"""`oncelog controller`: a controller on its own (for `serve --brokers N` and tests)."""
from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import click

from oncelog.cli import logs, startup
from oncelog.cli.options import overrides as _overrides
from oncelog.cli.startup import LOG_LEVELS
from oncelog.storage import cluster_credential
from oncelog.storage.cluster_credential import CredentialFileError


@click.command("controller")
@click.option("--metadata-dir", required=True, help="Where the metadata log and snapshots live.")
@click.option("--listener", default="127.0.0.1:0", show_default=True, help="host:port of the controller listener.")
@click.option("--credential-file", type=click.Path(dir_okay=False),
              help="The cluster credential (JSON username/password, mode 0600; made if missing): its user is "
              "the cluster principal, with which brokers register, take producer ids and follow the "
              "metadata. Default: cluster.credential beside the metadata directory.")
@click.option("--users-file", type=click.Path(exists=True, dir_okay=False),
              help="More SASL/PLAIN users, a JSON object name -> password (mode 0600): they may log in and "
              "get CLUSTER_AUTHORIZATION_FAILED, or a closed connection, for everything.")
@click.option("--session-timeout-ms", default=3000, show_default=True, help="A broker silent this long is dead.")
@click.option("--producer-id-floor", default=0, show_default=True, help="Never issue producer ids below this.")
@click.option("--add-scram", "add_scram", multiple=True, help="A SCRAM credential written when the metadata "
              "log is new (kafka-storage's --add-scram syntax; repeatable; ignored, with a warning, after).")
@click.option("--ssl-keystore-location", type=click.Path(exists=True, dir_okay=False),
              help="PEM with key and certificate chain: the listener speaks TLS (brokers set "
              "controller.listener.names and listener.name.<name>.ssl.truststore.location).")
@click.option("--override", "overrides", multiple=True, callback=_overrides, metavar="NAME=VALUE",
              help="connections.max.idle.ms, sasl.server.max.receive.size or "
              "connection.failed.authentication.delay.ms (Kafka's names and defaults; repeatable).")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="INFO", show_default=True)
def controller_command(metadata_dir, listener, credential_file, users_file, session_timeout_ms, producer_id_floor,
                       add_scram, ssl_keystore_location, overrides, log_level) -> None:
    """Run a controller on its own (for `serve --brokers N` and tests)."""
    from oncelog.controller.connection_limits import SETTINGS, ConnectionLimits
    from oncelog.controller.service import Controller, ControllerConfig
    logs.configure(log_level)
    unknown = sorted(set(overrides) - set(SETTINGS))
    if unknown:
        raise click.ClickException(f"the controller takes no setting {', '.join(unknown)} "
                                   f"(only {', '.join(SETTINGS)})")
    try:
        limits = ConnectionLimits.from_settings(overrides.get)
    except ValueError as e:
        raise click.ClickException(f"bad configuration: {e}") from None
    host, _, port = listener.rpartition(":")
    import secrets

    from oncelog.core.security.scram import AddScramError, parse_add_scram
    try:
        credential = cluster_credential.load_or_create(
            credential_file or cluster_credential.path_in(Path(metadata_dir).resolve().parent))
        users = {str(k): str(v) for k, v in json.loads(cluster_credential.read_private(users_file)).items()} \
            if users_file else {}
        scram = [parse_add_scram(a, secrets.token_bytes) for a in add_scram]
    except (AddScramError, CredentialFileError, ValueError, AttributeError) as e:
        raise click.ClickException(str(e)) from None
    users[credential.username] = credential.password
    tls = None
    if ssl_keystore_location:
        import ssl
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_cert_chain(ssl_keystore_location)

    async def run() -> None:
        c = Controller(ControllerConfig(metadata_dir, host, int(port), users, {credential.username},
                                        session_timeout_ms, producer_id_floor, bootstrap_scram=scram,
                                        ssl_context=tls, limits=limits))
        h, p = await c.start()
        click.echo(f"oncelog: controller listening on {h}:{p}")
        sys.stdout.flush()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await asyncio.wait([asyncio.ensure_future(stop.wait()), asyncio.ensure_future(c.fatal.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        await c.stop()
        if c.fatal.is_set():
            click.echo(f"oncelog: controller stopping: {c.fatal_message}")
            raise SystemExit(2)
    try:
        asyncio.run(run())
    except Exception as e:  # noqa: BLE001 - a start failure is one line (cli/startup.py); others re-raised
        raise startup.failure(e, log_level, [str(metadata_dir)]) from None
