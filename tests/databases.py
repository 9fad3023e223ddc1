"""A throwaway PostgreSQL cluster for the tests that cover PostgreSQL (the platform's production
database; SQLite is its default), started once per test session by tests/conftest.py."""

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.gateway.conftest import free_port


def pg_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return Path(dirs[-1]) if dirs else None


class Postgres:
    """A throwaway cluster in a temp dir; as the postgres user when run as root (it refuses
    root)."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="ty-pg-"))
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.data = self.dir / "data"
        self.admin_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str) -> None:
        subprocess.run([*self.as_user, *command], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -h 127.0.0.1 -F"  # -F: no fsync, a test cluster
        log = str(self.dir / "log")
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "start"
        )

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")

    def new_database(self) -> str:
        name = "ty_" + uuid.uuid4().hex[:12]
        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"
