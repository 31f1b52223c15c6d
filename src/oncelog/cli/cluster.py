"""`oncelog serve --brokers N`: a controller and N broker processes on one machine, sharing one
data directory; the controller assigns partition leaders. Writes `cluster.json` (controller
address and credentials, mode 0600) so that `oncelog admin` finds the controller."""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path

import click

from oncelog.broker.config import BrokerConfig
from oncelog.cli.admin import CLUSTER_FILE

_LISTENING = re.compile(r"listening on ([\w.\-]+):(\d+)")


def _add_scram_args(config) -> list[str]:
    """`--add-scram` for the controller, which holds the credentials (`oncelog.add.scram`)."""
    from oncelog.core.security.scram import split_add_scram_list
    return [arg for a in split_add_scram_list(config["oncelog.add.scram"]) for arg in ("--add-scram", a)]


def _controller_overrides(config) -> list[str]:
    """The brokers' connection limits apply to the controller's listener too."""
    from oncelog.controller.connection_limits import SETTINGS
    return [arg for name in SETTINGS for arg in ("--override", f"{name}={config[name]}")]


_PER_BROKER = {"listeners", "advertised.listeners", "log.dirs", "node.id", "metrics.port"}


def _start(cmd: list[str]) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None  # a pipe
    for line in proc.stdout:
        m = _LISTENING.search(line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    raise click.ClickException(f"{' '.join(cmd[3:5])} did not start (exit {proc.wait()})")


def serve_cluster(config: BrokerConfig, n: int, properties: str | None, overrides: dict[str, str],
                  log_level: str) -> None:
    data = Path(config.log_dirs[0]).resolve()
    data.mkdir(parents=True, exist_ok=True)
    user, password = "oncelog-broker", secrets.token_urlsafe(16)
    me = [sys.executable, "-m", "oncelog.cli.main"]
    procs: list[subprocess.Popen] = []
    try:
        ctl, chost, cport = _start(me + ["controller", "--metadata-dir", str(data / "__cluster_metadata"),
                                         "--listener", "127.0.0.1:0", "--user", f"{user}:{password}",
                                         "--cluster-principal", user, "--log-level", log_level,
                                         *_add_scram_args(config), *_controller_overrides(config)])
        procs.append(ctl)
        listener = config.listeners[0]
        shared = {k: v for k, v in overrides.items() if k not in _PER_BROKER}
        addresses = []
        for i in range(1, n + 1):
            port = listener.port + i - 1 if listener.port else 0
            cmd = me + ["serve"] + ([properties] if properties else []) + [
                "--log-dirs", str(data), "--listeners", f"{listener.name}://{listener.host}:{port}",
                "--log-level", log_level]
            settings = {**shared, "node.id": str(i), "oncelog.cluster": "true",
                        "controller.quorum.bootstrap.servers": f"{chost}:{cport}",
                        "controller.sasl.plain.username": user, "controller.sasl.plain.password": password}
            if config["metrics.port"] > 0:
                settings["metrics.port"] = str(config["metrics.port"] + i - 1)
            for k, v in settings.items():
                cmd += ["--override", f"{k}={v}"]
            proc, host, bport = _start(cmd)
            procs.append(proc)
            addresses.append(f"{host}:{bport}")
            click.echo(f"oncelog: broker {i} listening on {host}:{bport}")
        info = data / CLUSTER_FILE
        fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"controller": f"{chost}:{cport}", "username": user, "password": password,
                       "brokers": addresses}, f)
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
