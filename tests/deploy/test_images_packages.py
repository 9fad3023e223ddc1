"""The images install the project from its own package list (pyproject.toml), never from a copy of
it kept in the Dockerfiles: everything the entry point imports, and every data file a package
reads, is in that list and in the build context. A static check everywhere; a real `docker build`
where a Docker daemon answers."""

import ast
import fnmatch
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "deploy" / "docker").glob("*.Dockerfile"))
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
INCLUDED = SETUPTOOLS["packages"]["find"]["include"]
PACKAGE_DATA: dict[str, list[str]] = SETUPTOOLS["package-data"]


def _local_packages() -> set[str]:
    return {p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests"}


def _imports(module: Path) -> set[str]:
    """Top-level names a module imports: absolute imports (the project uses no others), and dotted
    module names in strings, which importlib imports (the CLI's subcommands)."""
    names = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", node.value):
                names.add(node.value.split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def entry_point_packages(local: set[str]) -> set[str]:
    """Local packages reachable by imports from the `tokenyard` command's package."""
    seen, todo = set(), ["tokenyard"]
    while todo:
        package = todo.pop()
        if package in seen:
            continue
        seen.add(package)
        for module in (ROOT / package).rglob("*.py"):
            todo += sorted(_imports(module) & local - seen)
    return seen


def _ignored(path: str) -> bool:
    patterns = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith(("#", "!"))
    ]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_every_package_the_entry_point_imports_is_listed_and_in_the_context() -> None:
    needed = entry_point_packages(_local_packages())
    assert {"gateway", "batch", "engine", "router"} <= needed  # the walk found the imports
    for package in sorted(needed):
        assert any(fnmatch.fnmatch(package, pattern) for pattern in INCLUDED), (
            f"{package} is imported by the tokenyard command but not in pyproject's packages"
        )
        assert not _ignored(package), f"{package} is left out of the build context"


def test_every_data_file_of_a_package_is_listed() -> None:
    """Files a package reads at run time (Lua, templates, migrations, artifacts, data) ship in the
    wheel only when package-data names them."""
    for package in sorted(_local_packages()):
        root = ROOT / package
        for path in root.rglob("*"):
            relative = path.relative_to(root).as_posix()
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in relative:
                continue
            if "node_modules" in relative:
                continue
            patterns = PACKAGE_DATA.get(package, [])
            assert any(root.glob(p) and path in set(root.glob(p)) for p in patterns), (
                f"{package}/{relative} is not in pyproject's package-data"
            )


def test_the_images_copy_no_list_of_packages_of_their_own() -> None:
    local = _local_packages()
    for dockerfile in DOCKERFILES:
        copies = re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile.read_text(), re.M)
        assert copies == ["."], f"{dockerfile.name} copies {copies}: copy the context whole"
        named = {word for line in copies for word in line.split()} & local
        assert not named, f"{dockerfile.name} names packages: {named}"


def _docker_daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0


@pytest.mark.skipif(not _docker_daemon(), reason="no Docker daemon answers on this machine")
def test_the_gateway_image_builds_and_its_command_imports() -> None:
    tag = "tokenyard-gateway:test"
    dockerfile = str(ROOT / "deploy" / "docker" / "gateway.Dockerfile")
    subprocess.run(["docker", "build", "-f", dockerfile, "-t", tag, str(ROOT)], check=True)
    run = ["docker", "run", "--rm", "--entrypoint", "python", tag]
    subprocess.run([*run, "-c", "import tokenyard.app, batch.api, tokenyard.cli"], check=True)
