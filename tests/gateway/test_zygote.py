"""The suite's zygote (tests/zygote.py) serves the gateway tests' environment, and a command forked
from it ends as the console script's does."""

import contextlib
import os
import signal
import subprocess

import pytest

from tests import SUITE_ENV
from tests.gateway.conftest import TOKENYARD, free_port
from tests.zygote import Zygote, _outside_settings, zygote


def test_the_gateway_tests_commands_fork_from_the_zygote(base_env):
    # the commands' environment is the one the suite started with, not os.environ as torch's import
    # and kernel builds have left it: otherwise no command forks, and each pays ~3 s of imports
    assert not {"KMP_INIT_AT_FORK", "TORCHINDUCTOR_CACHE_DIR"} & SUITE_ENV.keys()
    outside, started = _outside_settings(base_env), zygote().environ
    changed = {k for k in outside.keys() | started.keys() if outside.get(k) != started.get(k)}
    assert not changed and zygote().serves(base_env)
    assert not zygote().serves({**base_env, "SSL_CERT_FILE": os.devnull})
    argv = ["teams", "--help"]
    forked = zygote().run(argv, base_env)
    fresh = subprocess.run([*TOKENYARD, *argv], env=base_env, capture_output=True, text=True)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert forked.returncode == 0 and "teams" in forked.stdout


def test_a_forked_command_reports_its_exit_code(base_env):
    done = zygote().run(["no-such-command"], base_env)
    assert done.returncode == 2 and "no-such-command" in done.stderr


def test_a_command_whose_zygote_died_fails_instead_of_hanging(base_env, tmp_path):
    """The zygote writes a child's exit code: once it is gone, waiting on the child raises."""
    own = Zygote(tmp_path)
    argv = ["gateway", "--port", str(free_port())]
    child = own.spawn(argv, base_env, tmp_path / "out", tmp_path / "err")
    try:
        assert child.poll() is None
        own.proc.kill()
        own.proc.wait()
        with pytest.raises(RuntimeError, match="zygote exited"):
            child.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
