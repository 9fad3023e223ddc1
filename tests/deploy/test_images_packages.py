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
    """Dotted names of the project's packages: `tokenyard` and every package under it."""
    inits = (ROOT / "tokenyard").rglob("__init__.py")
    return {".".join(p.parent.relative_to(ROOT).parts) for p in inits}


def _imports(module: Path) -> set[str]:
    """Module names a module imports: absolute imports (the project uses no others), and dotted
    module names in strings, which importlib imports (the CLI's subcommands)."""
    names = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", node.value):
                names.add(node.value)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _package_of(name: str, local: set[str]) -> str | None:
    """The longest of the local packages that holds module `name` (or is it)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in local:
            return ".".join(parts[:n])
    return None


def entry_point_packages(local: set[str]) -> set[str]:
    """Local packages reachable by imports from the `tokenyard` command's package."""
    seen, todo = set(), ["tokenyard"]
    while todo:
        package = todo.pop()
        if package in seen:
            continue
        seen.add(package)
        for module in (ROOT / package.replace(".", "/")).glob("*.py"):
            found = {_package_of(name, local) for name in _imports(module)} - {None}
            todo += sorted(found - seen)
    return seen


def _ignored(path: str) -> bool:
    patterns = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith(("#", "!"))
    ]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_every_package_the_entry_point_imports_is_listed_and_in_the_context() -> None:
    local = _local_packages()
    needed = entry_point_packages(local)
    # the walk found the imports, the CLI's string-named subcommands among them
    assert {f"tokenyard.{name}" for name in ("gateway", "batch", "engine", "router")} <= needed
    for package in sorted(needed):
        assert any(fnmatch.fnmatch(package, pattern) for pattern in INCLUDED), (
            f"{package} is imported by the tokenyard command but not in pyproject's packages"
        )
        assert not _ignored(package.replace(".", "/")), f"{package} is left out of the context"


def test_every_data_file_of_a_package_is_listed() -> None:
    """Files a package reads at run time (Lua, templates, migrations, artifacts, data) ship in the
    wheel only when package-data names them, under the package that holds them."""
    for path in (ROOT / "tokenyard").rglob("*"):
        relative = path.relative_to(ROOT).as_posix()
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in relative:
            continue
        if "node_modules" in relative or path.suffix == ".so":  # built here, not shipped
            continue
        listed = [
            package
            for package, patterns in PACKAGE_DATA.items()
            for pattern in patterns
            if path in set((ROOT / package.replace(".", "/")).glob(pattern))
        ]
        assert listed, f"{relative} is not in pyproject's package-data"


def test_the_images_copy_no_list_of_packages_of_their_own() -> None:
    for dockerfile in DOCKERFILES:
        copies = re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile.read_text(), re.M)
        assert copies == ["."], f"{dockerfile.name} copies {copies}: copy the context whole"


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
    imports = "import tokenyard.app, tokenyard.batch.api, tokenyard.cli"
    subprocess.run([*run, "-c", imports], check=True)
