"""A throwaway Postgres cluster for the tests: initdb into a temporary folder, one server
listening on a unix socket in it (no TCP port at all), removed when the test session ends.

`postgres_dsn` (session scope) yields the cluster's DSN; `fresh_schema(dsn)` gives a DSN whose
tables land in a new, empty schema, so tests sharing the cluster do not see each other's rows.
Each xdist worker has a cluster of its own, but initdb (about a second of CPU) runs once for the
whole test session: every cluster's data folder is a copy of one made by the first that needs it.
Skips, with the reason, when Postgres is not installed (scripts/test installs it).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

SUPERUSER = "heddle"
# The socket's file is named after a port; with no TCP listener the number binds nothing.
SOCKET_PORT = 5432
START_SECONDS = 60.0
# The temporary folder as the suite found it, before tests/conftest.py points TMPDIR at a folder of
# the test session: the postgres user must reach the cluster's folder, and pytest's are root's alone.
_TEMP_ROOT = tempfile.gettempdir()
# Where the session's template data folder goes: named by tests/conftest.py in the process that
# starts the xdist workers (they inherit it), and removed by that process when the session ends.
TEMPLATE_ENV = "TESTS_POSTGRES_TEMPLATE"


def template_for_this_session() -> Path:
    return Path(_TEMP_ROOT) / f"heddle-pg-template-{os.getpid()}"


def remove_template(template: Path) -> None:
    shutil.rmtree(template, ignore_errors=True)
    template.with_name(template.name + ".lock").unlink(missing_ok=True)


def _bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "initdb").is_file():
            return Path(out)
    # Debian keeps the server binaries off PATH, under a folder per major version.
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]) if
                  d.split("/")[-2].isdigit() else 0)
    for d in reversed(dirs):
        if (Path(d) / "initdb").is_file() and (Path(d) / "postgres").is_file():
            return Path(d)
    return None


def _unprivileged() -> dict[str, Any]:
    """Popen arguments that run initdb and postgres as an ordinary user: both refuse root."""
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    pytest.skip("Postgres tests: running as root and there is no 'postgres' or 'nobody' user to run the server as")


def dsn_for(socket_dir: Path, database: str = "postgres") -> str:
    return f"postgresql://{SUPERUSER}@/{database}?host={quote(str(socket_dir), safe='')}&port={SOCKET_PORT}"


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[str]:
    """Start a cluster, yield its DSN, stop and remove it."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("Postgres is not installed (no initdb on PATH, from pg_config or in /usr/lib/postgresql); "
                    "scripts/test installs it, or: apt-get install postgresql")
    as_user = _unprivileged()
    root = Path(tempfile.mkdtemp(prefix="heddle-pg-", dir=_TEMP_ROOT))  # short: a unix socket path has ~100 bytes
    data, sock, log = root / "data", root / "sock", root / "log"
    sock.mkdir()
    if as_user:
        for path in (root, sock):
            os.chown(path, as_user["user"], as_user["group"])
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "HOME": str(root)}
    server: subprocess.Popen[bytes] | None = None
    try:
        template = os.environ.get(TEMPLATE_ENV)
        if template:
            _copy_of_template(Path(template), data, bindir, env, as_user)
        else:
            _initdb(bindir, data, env, as_user)
        with open(log, "wb") as out:
            if as_user:
                os.chown(log, as_user["user"], as_user["group"])
            server = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(data), "-k", str(sock), "-p", str(SOCKET_PORT),
                 "-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "dynamic_shared_memory_type=mmap", "-c", "max_connections=40",
                 "-c", "logging_collector=off"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=root, **as_user)
        dsn = dsn_for(sock)
        _wait_ready(server, dsn, log)
        yield dsn
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)  # fast shutdown: disconnect clients, stop now
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(root, ignore_errors=True)


def _initdb(bindir: Path, data: Path, env: dict[str, str], as_user: dict[str, Any]) -> None:
    init = subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "--no-sync", "-A", "trust", "-U", SUPERUSER, "-E", "UTF8",
         "--locale=C"], capture_output=True, text=True, env=env, cwd=data.parent, check=False, timeout=120, **as_user)
    if init.returncode != 0:
        pytest.fail(f"initdb failed (exit {init.returncode}): {init.stderr.strip() or init.stdout.strip()}")


def _copy_of_template(template: Path, data: Path, bindir: Path, env: dict[str, str], as_user: dict[str, Any]) -> None:
    """`data` as a copy of the session's template, which the first caller makes (the others wait on
    the lock): initdb into a folder of its own, renamed into place once whole."""
    with open(template.with_name(template.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.is_dir():
            making = Path(tempfile.mkdtemp(prefix=template.name + ".", dir=template.parent))
            if as_user:
                os.chown(making, as_user["user"], as_user["group"])
            try:
                _initdb(bindir, making / "data", env, as_user)
                (making / "data").rename(template)
            finally:
                shutil.rmtree(making, ignore_errors=True)
    # By the server's user, so that the copy is its own, as initdb would have left it.
    copied = subprocess.run(["cp", "-a", str(template), str(data)], capture_output=True, text=True, check=False,
                            timeout=120, **as_user)
    if copied.returncode != 0:
        pytest.fail(f"copying the template cluster {template} failed: {copied.stderr.strip()}")


def _wait_ready(server: subprocess.Popen[bytes], dsn: str, log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + START_SECONDS
    last = ""
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"postgres exited with {server.returncode} before it accepted connections: "
                        f"{log.read_text(errors='replace')[-2000:]}")
        try:
            with psycopg.connect(dsn, connect_timeout=2):
                return
        except psycopg.OperationalError as exc:
            last = str(exc)
        time.sleep(0.05)
    pytest.fail(f"postgres did not accept connections within {START_SECONDS}s: {last}; "
                f"log: {log.read_text(errors='replace')[-2000:]}")


def fresh_schema(dsn: str) -> str:
    """A new empty schema in the cluster, and the DSN whose unqualified tables land in it."""
    import psycopg

    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return f"{dsn}&options={quote(f'-csearch_path={name}', safe='')}"


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The DSN of a throwaway cluster shared by the test session (one per xdist worker)."""
    with throwaway_cluster() as dsn:
        yield dsn
