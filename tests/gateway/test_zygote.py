"""The suite's zygote (tests/zygote.py) serves the gateway tests' environment, also after the
engine's kernels were built in this process, and a command forked from it ends as the console
script's does."""

import subprocess

from tests.gateway.conftest import TOKENYARD
from tests.zygote import zygote


def test_the_gateway_tests_commands_fork_from_the_zygote(base_env):
    # fails when something in the suite leaves os.environ changed (the kernel build once left
    # ninja's directory on PATH): every gateway and command then paid ~3 s of imports again
    assert zygote().serves(base_env)
    argv = ["teams", "--help"]
    forked = zygote().run(argv, base_env)
    fresh = subprocess.run([*TOKENYARD, *argv], env=base_env, capture_output=True, text=True)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert forked.returncode == 0 and "teams" in forked.stdout


def test_a_forked_command_reports_its_exit_code(base_env):
    done = zygote().run(["no-such-command"], base_env)
    assert done.returncode == 2 and "no-such-command" in done.stderr
