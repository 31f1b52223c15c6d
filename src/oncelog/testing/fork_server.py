"""A fork server for the brokers and controllers a test suite starts (`testing.embedded`).

The suite starts about 400 `oncelog serve` and `oncelog controller` processes. Each spent 0.8
CPU-s importing what serving needs before it listened, 0.75 of its 0.8 s start: some 300 CPU-s of
a CI run on a 2-core machine. Here one process per test process imports all that once and forks a
child for each start (the zygote of Android, Spark's `pyspark.daemon`); the child then runs the
command line's `main` as `python -m oncelog.cli.main ...` would.

A forked server is a process of its own like an exec'd one: its own pid (kill -9, SIGSTOP and
SIGTERM reach it alone), its own files, sockets and event loop, the environment, working directory
and descriptors of its start, stdout and stderr where `ServerProcess` puts them, and the exit
status of its `main`. What differs: `/proc/<pid>/cmdline` is the fork server's, the interpreter's
own start-up settings (`PYTHON*` variables, the hash seed) are the fork server's, and a child is
reaped by the fork server (`ForkedProcess.poll/wait` ask it, after its pidfd says it exited).

Used when ONCELOG_TEST_FORK_SERVER=1 (tests/conftest.py sets it), for the servers and for the
tests' other `oncelog` commands (`run`, as `subprocess.run`: each exec'd one spent 0.9 CPU-s
starting); `oncelog verify` and the benchmarks start their servers with exec, as before.

    python -m oncelog.testing.fork_server FD     the server, on the SOCK_SEQPACKET socket FD
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

ENV = "ONCELOG_TEST_FORK_SERVER"
# The command line a child runs, and what `oncelog serve` and `oncelog controller` import. Named, not
# imported: the fork server runs the command line as a program, as exec would (the layers above
# testing stay above it).
COMMAND_LINE = "oncelog.cli.main"
WARM = (COMMAND_LINE, "oncelog.cli.serve", "oncelog.cli.controller_command", "oncelog.broker.net.server",
        "oncelog.storage.failpoints",
        # the other commands' modules: 0.18 CPU-s more, once
        *(f"oncelog.cli.{name}" for name in ("connect", "topic", "produce", "consume", "group", "admin", "acl",
                                             "user", "cluster", "cluster_info", "transactions", "share_group",
                                             "log_dump", "logs", "quota", "startup")))
_MAX_MESSAGE = 1 << 20


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


# ---------------------------------------------------------------------------------- the client

class ForkedProcess:
    """The part of `subprocess.Popen` that `ServerProcess` and tests use, for a forked child."""

    def __init__(self, server: ForkServer, pid: int, args: list[str], stdout: IO[bytes] | None) -> None:
        self.server, self.pid, self.args, self.stdout = server, pid, args, stdout
        self.returncode: int | None = None
        # the child stays a zombie of the fork server until it is reaped on our asking, so its
        # pid cannot be reused before this opens it
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._reap()
        assert self.returncode is not None
        return self.returncode

    def _reap(self) -> None:
        self.returncode = int(self.server.request({"op": "reap", "pid": self.pid})["code"])
        os.close(self._pidfd)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The fork server of this process, started on first use."""

    _current: ForkServer | None = None

    @classmethod
    def get(cls) -> ForkServer:
        server = cls._current
        if server is None or server.owner != os.getpid() or server.proc.poll() is not None:
            server = cls._current = cls()
        return server

    def __init__(self) -> None:
        self.owner = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        theirs.close()
        self.sock = ours
        self._lock = threading.Lock()   # one request and its answer at a time (threads of `verify`)

    def request(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        with self._lock:
            socket.send_fds(self.sock, [json.dumps(message).encode()], fds or [])
            answer = self.sock.recv(_MAX_MESSAGE)
        if not answer:
            raise RuntimeError("the fork server exited (its stderr is the test's)")
        out: dict[str, Any] = json.loads(answer)
        if "error" in out:
            raise RuntimeError(f"the fork server could not start {message.get('argv')}: {out['error']}")
        return out

    def spawn(self, argv: list[str], *, env: dict[str, str], stderr: int | None,
              pass_fds: tuple[int, ...] = (), stdin: int | None = None,
              stdout: int | None = None) -> ForkedProcess:
        """`python -m oncelog.cli.main *argv`, stdout to the descriptor `stdout` or else to a
        pipe (the returned process's `stdout`), stderr to the descriptor `stderr` (None: where
        stdout goes), stdin from `stdin` (None: the fork server's, /dev/null); each of `pass_fds`
        that the command line names is renumbered in it to where the child has it."""
        read_end, write_end = os.pipe() if stdout is None else (None, stdout)
        try:
            fd_args = [argv.index(str(fd)) for fd in pass_fds]
            stdin_fds = [] if stdin is None else [stdin]
            pid = int(self.request({"op": "spawn", "argv": argv, "env": env, "cwd": os.getcwd(),
                                    "fd_args": fd_args, "stdin": stdin is not None},
                                   [write_end, write_end if stderr is None else stderr, *stdin_fds,
                                    *pass_fds])["pid"])
        except BaseException:
            if read_end is not None:
                os.close(read_end)
            raise
        finally:
            if read_end is not None:
                os.close(write_end)
        return ForkedProcess(self, pid, argv, os.fdopen(read_end, "rb") if read_end is not None else None)


def run(argv: list[str], *, input: bytes = b"", env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`subprocess.run([python, "-m", "oncelog.cli.main", *argv], input=input, capture_output=True,
    timeout=timeout, env=env)`, forked: stdin, stdout and stderr are anonymous files, so nothing
    waits on a full pipe."""
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        stdin.write(input)
        stdin.flush()
        stdin.seek(0)
        proc = ForkServer.get().spawn(argv, env=env, stdin=stdin.fileno(), stdout=out.fileno(), stderr=err.fileno())
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, code, out.read(), err.read())


# ---------------------------------------------------------------------------------- the server

def _child(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: become `python -m oncelog.cli.main *argv`; its exit code."""
    import atexit
    import logging
    import random
    import traceback

    from oncelog.storage import failpoints
    stdout, stderr, *passed = fds
    if request.get("stdin"):
        stdin, *passed = passed
        os.dup2(stdin, 0)
        os.close(stdin)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for fd in {stdout, stderr}:
        os.close(fd)
    argv = list(request["argv"])
    for position, fd in zip(request["fd_args"], passed):
        argv[position] = str(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()                                         # not the fork server's sequence
    failpoints.configure(os.environ.get(failpoints.ENV))   # read at import in an exec'd process
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [COMMAND_LINE, *argv]
    # runpy runs the module's code afresh as __main__ (what it imports stays warm); left in
    # sys.modules, the module would make runpy warn on stderr, which exec'd commands never print
    sys.modules.pop(COMMAND_LINE, None)
    code: int = 0
    try:
        # as `python -m oncelog.cli.main` runs it (sys.argv[0] becomes its file)
        runpy.run_module(COMMAND_LINE, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:   # noqa: BLE001 - what the interpreter would print, and its exit status
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _serve(sock: socket.socket) -> None:
    for name in WARM:   # once, before any fork (about 600 modules)
        importlib.import_module(name)
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 16)
        except ConnectionResetError:
            return
        if not data:
            return   # the test process is gone
        request = json.loads(data)
        try:
            if request["op"] == "spawn":
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        sock.close()
                        code = _child(request, fds)
                    finally:
                        os._exit(code)
                answer: dict[str, Any] = {"pid": pid}
            elif request["op"] == "reap":
                _pid, status = os.waitpid(int(request["pid"]), 0)
                answer = {"code": os.waitstatus_to_exitcode(status)}
            else:
                answer = {"error": f"unknown request {request['op']!r}"}
        except OSError as e:
            answer = {"error": str(e)}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(answer).encode())


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
