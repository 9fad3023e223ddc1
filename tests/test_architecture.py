"""The import direction of docs/architecture.md, as pyproject.toml's import-linter contracts state
it: kept by the code, and broken by an upward import."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())",
]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LINT, "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_packages_import_downward_only() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


def test_an_upward_import_or_training_code_in_serving_breaks_the_check(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "tokenyard",
        tmp_path / "tokenyard",
        ignore=shutil.ignore_patterns(
            "__pycache__", "*.so", "artifacts", "data", "static", "templates", "csrc"
        ),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    usage = tmp_path / "tokenyard" / "core" / "usage.py"
    usage.write_text(usage.read_text() + "\nfrom tokenyard.gateway.proxy import Proxy  # noqa\n")
    # and serving reaching training code: the guard's runtime loading its data module
    service = tmp_path / "tokenyard" / "guard" / "service.py"
    service.write_text(
        service.read_text() + "\nfrom tokenyard.guard.training import dataset  # noqa\n"
    )
    done = _lint(tmp_path)
    assert done.returncode == 1
    assert "tokenyard.core is not allowed to import tokenyard.gateway" in done.stdout
    assert "tokenyard.core.usage -> tokenyard.gateway.proxy" in done.stdout
    assert "tokenyard.app is not allowed to import tokenyard.guard.training" in done.stdout
    assert "tokenyard.guard.service -> tokenyard.guard.training.dataset" in done.stdout
    assert "Contracts: 2 kept, 2 broken." in done.stdout
