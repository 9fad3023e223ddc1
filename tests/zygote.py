"""A process that has imported the platform once and forks a `tokenyard` command on request.

The suite starts a gateway about 90 times. A fresh `tokenyard gateway` spends about 3 of its 4.5
seconds of single-core CPU importing the project and its dependencies (2-core AVX2 EPYC); a fork of
this process skips that and runs the same `tokenyard.cli.main` with the test's environment and
arguments. Nothing in tokenyard reads the environment or builds state at import time, so the child
behaves as the command would; dependencies may (aiohttp builds its TLS contexts from SSL_CERT_FILE
at import), so a command whose environment differs from the zygote's outside TOKENYARD_* (and
pytest's PYTEST_*) variables is not served by it (`serves`), and the suite starts it as a fresh
process.

Protocol, one connection per command on a Unix socket: the client sends one JSON line
{"argv": [...], "env": {...}, "cwd": path, "stdout": path, "stderr": path, "exit": path}; the
zygote answers the child's pid. When the child ends, the zygote writes its exit code (a negative
signal number when killed, as subprocess reports it) to the `exit` path.
"""

import contextlib
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests import SUITE_ENV

PRELOAD = [
    "tokenyard.cli",
    "tokenyard.app",
    "tokenyard.serve",
    "uvicorn",
    "uvicorn.loops.uvloop",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.on",
]


def _run_child(request: dict[str, Any]) -> None:
    """In the forked child: become the command, then exit with its code."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    os.chdir(request["cwd"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.environ.clear()
    os.environ.update(request["env"])
    code: int | str | None = 0
    try:
        from tokenyard.cli import main

        main(request["argv"])
    except SystemExit as done:
        code = done.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if isinstance(code, str):  # sys.exit("message"): printed, status 1, as the interpreter does
        print(code, file=sys.stderr)
        code = 1
    import atexit

    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # what the interpreter runs at exit (logging's flush among them)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def serve(path: str) -> None:
    for module in PRELOAD:
        __import__(module)
    exits: dict[int, str] = {}

    def reap(*_: Any) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            target = exits.pop(pid, None)
            if target is not None:
                Path(target + ".tmp").write_text(str(os.waitstatus_to_exitcode(status)))
                os.replace(target + ".tmp", target)

    signal.signal(signal.SIGCHLD, reap)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)
    while True:
        # the suite holds the other end of stdin: when it ends, so does the zygote
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready:
            return
        conn, _ = listener.accept()
        with conn:
            request = json.loads(conn.makefile().readline())
            sys.stdout.flush()
            sys.stderr.flush()
            # the child may end before its exit path is recorded: hold SIGCHLD until it is
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                _run_child(request)
            exits[pid] = request["exit"]
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            conn.sendall(f"{pid}\n".encode())


def _outside_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The environment less the platform's settings and pytest's note of the running test (which
    changes with each test phase and is read by nothing at import)."""
    return {k: v for k, v in env.items() if not k.startswith(("TOKENYARD_", "PYTEST_"))}


class Forked:
    """What the suite holds of a forked command: subprocess.Popen's pid, poll, wait and signals.
    The zygote is its parent, so the exit code arrives through a file."""

    def __init__(self, pid: int, exit_path: Path, zygote: subprocess.Popen[bytes]) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exit = exit_path
        self._zygote = zygote

    def poll(self) -> int | None:
        if self.returncode is None and self._exit.exists():
            self.returncode = int(self._exit.read_text())
            self._exit.unlink()
        elif self.returncode is None and self._zygote.poll() is not None:
            # nobody is left to write the exit code: fail rather than wait forever
            code = self._zygote.returncode
            raise RuntimeError(f"the test zygote exited ({code}) under pid {self.pid}")
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """A zygote process, started with its imports done; it ends when the suite does."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = folder / "zygote.sock"
        self.environ = _outside_settings(SUITE_ENV)
        self._count = 0
        command = [sys.executable, "-m", "tests.zygote", str(self.socket)]
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(command, cwd=root, env=SUITE_ENV, stdin=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test zygote did not start (exit {self.proc.poll()})")
            time.sleep(0.05)

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a command with this environment behaves the same forked from the zygote."""
        return _outside_settings(env) == self.environ

    def _new_path(self, kind: str) -> Path:
        self._count += 1
        return self.folder / f"{kind}-{self._count}"

    def spawn(self, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> Forked:
        exit_path = self._new_path("exit")
        request = {
            "argv": argv,
            "env": env,
            "stdout": str(stdout),
            "stderr": str(stderr),
            "exit": str(exit_path),
            "cwd": os.getcwd(),
        }
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(self.socket))
            conn.sendall((json.dumps(request) + "\n").encode())
            pid = int(conn.makefile().readline())
        return Forked(pid, exit_path, self.proc)

    def run(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """The command to its end, as subprocess.run(..., capture_output=True, text=True)."""
        stdout, stderr = self._new_path("stdout"), self._new_path("stderr")
        code = self.spawn(argv, env, stdout, stderr).wait()
        done = subprocess.CompletedProcess(argv, code, stdout.read_text(), stderr.read_text())
        stdout.unlink()
        stderr.unlink()
        return done


@functools.cache
def zygote() -> Zygote:
    return Zygote(Path(tempfile.mkdtemp(prefix="tokenyard-zygote-")))


if __name__ == "__main__":
    serve(sys.argv[1])
