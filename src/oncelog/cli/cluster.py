"""`oncelog serve --brokers N`: a controller and N broker processes on one machine, sharing one
data directory; the controller assigns partition leaders.

No secret reaches a command line (`/proc/<pid>/cmdline` is readable by every local user): the
cluster credential is made once per data directory and kept in `cluster.credential` (mode 0600),
which the controller and the brokers read themselves; the settings given to this command reach
the brokers through an inherited descriptor (`serve --overrides-fd`); `--add-scram` credentials
are written into the metadata log here, when it is new, before the controller starts (as
`kafka-storage format --add-scram`), and ignored with a warning afterwards. `cluster.json` (0600)
tells `oncelog admin` where the controller is."""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import click

from oncelog.broker.config import BrokerConfig
from oncelog.cli.admin import CLUSTER_FILE
from oncelog.storage import cluster_credential
from oncelog.storage.dir_lock import DirectoryLock, DirectoryLocked

_LISTENING = re.compile(r"listening on ([\w.\-]+):(\d+)")
METADATA_DIR = "__cluster_metadata"


def _controller_overrides(config) -> list[str]:
    """The brokers' connection limits apply to the controller's listener too."""
    from oncelog.controller.connection_limits import SETTINGS
    return [arg for name in SETTINGS for arg in ("--override", f"{name}={config[name]}")]


_PER_BROKER = {"listeners", "advertised.listeners", "log.dirs", "node.id", "metrics.port", "controller.listener"}


def _start(cmd: list[str], settings: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, int]:
    """Start `cmd`; `settings` go to it as JSON through an inherited descriptor (`--overrides-fd`)."""
    with tempfile.TemporaryFile("w+") as handoff:   # unlinked: only the two processes can reach it
        fds: tuple[int, ...] = ()
        if settings is not None:
            json.dump(settings, handoff)
            handoff.flush()
            handoff.seek(0)
            cmd = [*cmd, "--overrides-fd", str(handoff.fileno())]
            fds = (handoff.fileno(),)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, pass_fds=fds)
    assert proc.stdout is not None  # a pipe
    for line in proc.stdout:
        m = _LISTENING.search(line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    raise click.ClickException(f"{' '.join(cmd[3:5])} did not start (exit {proc.wait()})")


def _format_scram(config: BrokerConfig, metadata_dir: Path) -> None:
    from oncelog.controller.scram import format_log
    from oncelog.core.security.scram import parse_add_scram_list
    adds = parse_add_scram_list(config["oncelog.add.scram"], secrets.token_bytes)
    if adds and format_log(metadata_dir, adds):
        click.echo(f"oncelog: SCRAM credentials of {', '.join(sorted({a.name for a in adds}))} written to the "
                   f"new metadata log")


def serve_cluster(config: BrokerConfig, n: int, properties: str | None, overrides: dict[str, str],
                  log_level: str) -> None:
    data = Path(config.log_dirs[0]).resolve()
    try:  # held while the cluster runs: a second `serve` of either kind refuses this directory
        lock = DirectoryLock.cluster_member(data, "cluster", "a cluster (serve --brokers)")
    except DirectoryLocked as e:
        raise click.ClickException(str(e)) from None
    credential_file = cluster_credential.path_in(data)
    cluster_credential.load_or_create(credential_file)
    _format_scram(config, data / METADATA_DIR)
    me = [sys.executable, "-m", "oncelog.cli.main"]
    procs: list[subprocess.Popen] = []
    try:
        ctl, chost, cport = _start(me + ["controller", "--metadata-dir", str(data / METADATA_DIR),
                                         "--listener", config["controller.listener"],
                                         "--credential-file", str(credential_file),
                                         "--log-level", log_level, *_controller_overrides(config)])
        procs.append(ctl)
        listener = config.listeners[0]
        shared = {k: v for k, v in overrides.items() if k not in _PER_BROKER}
        addresses = []
        for i in range(1, n + 1):
            port = listener.port + i - 1 if listener.port else 0
            cmd = me + ["serve"] + ([properties] if properties else []) + [
                "--log-dirs", str(data), "--listeners", f"{listener.name}://{listener.host}:{port}",
                "--log-level", log_level]
            settings = {**shared, "node.id": str(i), "oncelog.cluster": "true", "oncelog.add.scram": "",
                        "controller.quorum.bootstrap.servers": f"{chost}:{cport}"}
            if config["metrics.port"] > 0:
                settings["metrics.port"] = str(config["metrics.port"] + i - 1)
            proc, host, bport = _start(cmd, settings)
            procs.append(proc)
            addresses.append(f"{host}:{bport}")
            click.echo(f"oncelog: broker {i} listening on {host}:{bport}")
        info = data / CLUSTER_FILE
        fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"controller": f"{chost}:{cport}", "brokers": addresses}, f)
        click.echo(f"oncelog: cluster of {n} brokers, controller on {chost}:{cport}; clients connect with "
                   f"bootstrap.servers={','.join(addresses)}")
        sys.stdout.flush()
        done = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: done.set())
        done.wait()
    finally:
        click.echo("oncelog: stopping the cluster")
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        lock.release()
