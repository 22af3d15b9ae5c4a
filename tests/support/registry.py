"""A real OCI registry for the tests: Debian's `docker-registry` (the CNCF distribution registry)
serving on 127.0.0.1 at a port it picks itself, with filesystem storage in a temporary folder,
without auth or with htpasswd basic auth; stopped and removed when the fixture ends.

Skips, with the reason, when `docker-registry` is not installed (scripts/test installs it), or
when no bcrypt htpasswd line can be made (`htpasswd -B` from apache2-utils, else Python's bcrypt).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

USER, PASSWORD = "heddle-test", "s3cret-registry-pw"
START_SECONDS = 30.0


@dataclass(frozen=True)
class RunningRegistry:
    address: str  # 127.0.0.1:PORT
    storage: Path
    username: str | None = None
    password: str | None = None

    def ref(self, name: str) -> str:
        """`oci://127.0.0.1:PORT/NAME` (NAME is REPO:TAG or REPO@DIGEST)."""
        return f"oci://{self.address}/{name}"

    def blob_data(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (its filesystem driver's layout)."""
        hexdigest = digest.removeprefix("sha256:")
        return self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexdigest[:2] / hexdigest / "data"


def htpasswd_line(user: str, password: str) -> str:
    """`user:bcrypt-hash`, from htpasswd -B, else Python's bcrypt; skips when neither is there."""
    program = shutil.which("htpasswd")
    if program is not None:
        done = subprocess.run([program, "-nbB", user, password], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.startswith(f"{user}:$2"):
            return done.stdout.strip()
    try:
        import bcrypt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pytest.skip("no way to make a bcrypt htpasswd file: install apache2-utils (htpasswd -B) or Python's bcrypt "
                    "(scripts/test installs apache2-utils)")
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
    return f"{user}:{hashed}"


def _drain(stream: object, into: list[str], ready: threading.Event) -> None:
    """Keep the registry's log pipe empty; note the line that says where it listens."""
    for line in stream:  # type: ignore[attr-defined]
        if len(into) < 2000:
            into.append(line)
        if "listening on " in line and not ready.is_set():
            ready.set()
    ready.set()


@contextlib.contextmanager
def running_registry(root: Path, *, auth: bool = False) -> Iterator[RunningRegistry]:
    program = shutil.which("docker-registry")
    if program is None:
        pytest.skip("docker-registry is not installed; scripts/test installs it, or: apt-get install docker-registry")
    root.mkdir(parents=True, exist_ok=True)
    storage = root / "storage"
    storage.mkdir()
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": {"addr": "127.0.0.1:0", "secret": "heddle-tests-only"},
    }
    if auth:
        (root / "htpasswd").write_text(htpasswd_line(USER, PASSWORD) + "\n")
        config["auth"] = {"htpasswd": {"realm": "heddle-tests", "path": str(root / "htpasswd")}}
    (root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    proc = subprocess.Popen([program, "serve", str(root / "config.yml")], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()
    drain = threading.Thread(target=_drain, args=(proc.stderr, lines, ready), daemon=True)
    drain.start()
    try:
        ready.wait(START_SECONDS)
        found = next((line.split("listening on ", 1)[1].split()[0].strip('"') for line in lines
                      if "listening on " in line), None)
        if found is None:
            raise AssertionError(f"docker-registry did not start: {''.join(lines[-20:])}")
        yield RunningRegistry(found, storage, USER if auth else None, PASSWORD if auth else None)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(5)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """A registry without auth, for the module."""
    with running_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """A registry that asks for basic auth (htpasswd, bcrypt), for the module."""
    with running_registry(tmp_path_factory.mktemp("auth-registry"), auth=True) as running:
        yield running
