"""Fixtures every test folder may use: the databases the platform runs on (one PostgreSQL cluster
for the whole session, where its binaries are installed), and the engine's converted tokenizer."""

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.databases import Postgres, pg_bin
from tokenyard.core.db import get_engine


@pytest.fixture(scope="session")
def converted_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An engine cache folder's `tokenizers/`, holding SmolLM2's converted tokenizer, for the data
    dirs of the engine servers the suite starts to link to: each would convert it again (9 s of a
    start on a 2-core machine). Kept from this process's own conversion, free where the engine's
    tests ran here first (`_hf_tokenizer` is cached per process, by the arguments the engine
    passes), otherwise made once here."""
    from tokenyard.engine.loader import resolve_model_path
    from tokenyard.engine.tokenizer import _converted_folder, _hf_tokenizer, _keep

    cache = str(tmp_path_factory.mktemp("engine-cache"))
    gguf = resolve_model_path("smollm2")
    folder = _converted_folder(gguf, cache)
    _keep(_hf_tokenizer(gguf, ""), folder)
    assert (folder / "tokenizer.json").is_file()
    return folder.parent


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    bin_dir = pg_bin()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        pytest.skip("PostgreSQL is not installed (no pg_ctl/initdb): apt-get install postgresql")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: PostgreSQL refuses to run as root")
    server = Postgres(bin_dir)
    server.init()
    server.start()
    yield server
    with contextlib.suppress(subprocess.CalledProcessError):
        server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty database on SQLite and on PostgreSQL: its URL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/platform.db"
    return request.getfixturevalue("postgres").new_database()


@pytest.fixture
def database(database_url: str) -> Engine:
    """A migrated, empty platform database (every table), on SQLite and on PostgreSQL."""
    return get_engine(database_url)
