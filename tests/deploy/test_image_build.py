"""The server image itself, as scripts/image builds it (scripts/test builds it before the tests, and
buildah keeps its layers, so only a change rebuilds): its Python packages are the locked files, each
named by hash; its base is pinned by digest; and, run as the pod runs it (read-only root,
uid 10001, the volumes as tmpfs, the trusted key read-only), it pulls a bundle from the test registry,
refuses one signed by another key before its port opens, serves one it trusts, and drains on SIGTERM.

Skips, naming what is missing, where podman is not installed or scripts/image has not built the
image (no buildah, no user namespaces, no mirror to make the base from). Where podman's OCI runtime
cannot start a container (in a sandbox that forbids setrlimit, crun refuses), the image's own root
filesystem runs under bubblewrap instead, read-only, as the image's user, with the image's entrypoint
and environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import heddle.oci
from tests.deploy.image import CONTAINERFILE, REPO
from tests.deploy.test_image import DEADLINE_S, PREFIX, Made, made  # noqa: F401 (a fixture)
from tests.support.registry import RunningRegistry, registry  # noqa: F401 (a fixture)
from tests.support.scripted_model import _read_line

IMAGE = "localhost/heddle-server:dev"
LOCK = REPO / "deploy" / "image" / "requirements.txt"
TOKEN = "image-test-token"


def test_the_image_installs_only_locked_hashed_packages_on_a_base_pinned_by_digest() -> None:
    text = CONTAINERFILE.read_text(encoding="utf-8")
    (base,) = re.findall(r"^ARG BASE=(\S+)$", text, flags=re.MULTILINE)
    assert re.fullmatch(r"docker\.io/library/debian:bookworm-slim@sha256:[0-9a-f]{64}", base), base
    assert re.findall(r"^FROM (\S+)", text, flags=re.MULTILINE) == ["${BASE}", "${BASE}"]
    installs = [line for line in re.sub(r"\\\n", " ", text).splitlines() if "pip install" in line]
    assert installs and all("--no-deps" in line for line in installs)
    (from_index,) = [line for line in installs if "--no-index" not in line]
    assert "--require-hashes" in from_index and "-r /src/requirements.txt" in from_index
    # Every requirement pinned to one version, with at least one hash; heddle's build backend too.
    lock = LOCK.read_text(encoding="utf-8")
    assert "pip-compile" in lock and "--find-links" not in lock and "--index-url" not in lock
    entries = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", lock,
                         flags=re.MULTILINE)
    names = {name.lower() for name, _, _ in entries}
    assert len(entries) == len(re.findall(r"^[A-Za-z0-9]", lock, flags=re.MULTILINE))
    assert {"starlette", "uvicorn", "cryptography", "psycopg-binary", "opentelemetry-sdk", "setuptools"} <= names


def _image_config(buildah: str) -> dict[str, Any]:
    done = subprocess.run([buildah, "inspect", "--type", "image", IMAGE], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"{IMAGE} is not built: scripts/image builds it (buildah, and the Debian mirror or docker.io)")
    config: dict[str, Any] = json.loads(done.stdout)["OCIv1"]["config"]
    return config


def _podman_runs(podman: str | None) -> bool:
    # Where the OCI runtime cannot start a container (crun: setrlimit not permitted in this sandbox).
    return podman is not None and subprocess.run(
        [podman, "run", "--rm", IMAGE, "--version"], capture_output=True, check=False, timeout=60).returncode == 0


@pytest.fixture
def pod(tmp_path: Path, made: Made) -> Iterator[list[str]]:  # noqa: F811
    """The image started as the Deployment starts the pod, up to its arguments: podman, else bubblewrap
    over the image's own root filesystem (`buildah mount`) with the image's entrypoint, user and env."""
    buildah = shutil.which("buildah")
    if buildah is None:
        pytest.skip("buildah is not installed (scripts/image builds the image with it): apt-get install buildah")
    config = _image_config(buildah)
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copy(made.pub, trust / "release.pub")
    podman = shutil.which("podman")
    if _podman_runs(podman):
        name = f"heddle-image-test-{tmp_path.name}"
        yield [str(podman), "run", "--rm", "--name", name, "--network", "host", "--read-only",
               "--user", "10001:10001", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               "--tmpfs", "/var/cache/heddle:rw,mode=1777", "--tmpfs", "/var/lib/heddle/work:rw,exec,mode=1777",
               "-v", f"{trust}:/etc/heddle/trust:ro", "-e", f"HEDDLE_AUTH_TOKEN={TOKEN}", IMAGE]
        subprocess.run([str(podman), "rm", "--force", "--ignore", name], check=False, capture_output=True)
        return
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("neither podman nor bubblewrap can run the image here: apt-get install podman bubblewrap")
    container = subprocess.run([buildah, "from", "--pull-never", IMAGE], capture_output=True, text=True,
                               check=True).stdout.strip()
    try:
        root = subprocess.run([buildah, "mount", container], capture_output=True, text=True,
                              check=True).stdout.strip()
        uid, _, gid = config["User"].partition(":")
        env = [*config["Env"], f"HEDDLE_AUTH_TOKEN={TOKEN}"]
        # The pod's view: the image read-only, its user, the two memory volumes sticky, the key read-only.
        yield [bwrap, "--unshare-user", "--uid", uid, "--gid", gid or uid, "--unshare-pid", "--as-pid-1",
               "--unshare-ipc",
               "--die-with-parent", "--ro-bind", root, "/", "--proc", "/proc", "--dev", "/dev",
               "--perms", "1777", "--tmpfs", "/var/cache/heddle", "--perms", "1777", "--tmpfs", "/var/lib/heddle/work",
               "--ro-bind", str(trust), "/etc/heddle/trust", "--clearenv",
               *(arg for pair in env for arg in ("--setenv", *pair.split("=", 1))),
               *config["Entrypoint"]]
    finally:
        subprocess.run([buildah, "umount", container], check=False, capture_output=True)
        subprocess.run([buildah, "rm", container], check=False, capture_output=True)


def _args(bundle: str) -> list[str]:
    # Last wins: the loopback address at a port of its own, for the entrypoint's 0.0.0.0:4319.
    return [f"--bundle={bundle}", "--trust=/etc/heddle/trust/release.pub", "--host", "127.0.0.1", "--port", "0"]


def _terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the container's PID 1 (tini, which hands it to heddle-server), as the kubelet sends it:
    podman forwards it; bubblewrap does not, so it goes to the process bubblewrap started."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    is_bwrap = Path(f"/proc/{process.pid}/exe").resolve().name == "bwrap"
    os.kill(int(children[0]) if is_bwrap and children else process.pid, signal.SIGTERM)


def test_the_image_runs_read_only_as_its_user_verifying_before_its_port_opens(
        pod: list[str], made: Made, registry: RunningRegistry) -> None:  # noqa: F811
    heddle.oci.push(made.bundles["untrusted"], registry.ref("agent:stranger"))
    refused = subprocess.run([*pod, *_args(registry.ref("agent:stranger"))], capture_output=True, text=True,
                             check=False, timeout=60, stdin=subprocess.DEVNULL)
    assert refused.returncode == 4 and PREFIX not in refused.stdout, refused.stderr
    assert "trust" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr

    v1 = heddle.oci.push(made.bundles["v1"], registry.ref("agent:prod"))
    process = subprocess.Popen([*pod, *_args(registry.ref("agent:prod"))], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = _read_line(process, time.monotonic() + 60).decode(errors="replace").strip()
        assert line.startswith(PREFIX), line
        base = line[len(PREFIX):].replace("0.0.0.0", "127.0.0.1")
        with httpx.Client(base_url=base, timeout=DEADLINE_S, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            assert client.get("/readyz").status_code == 200
            assert client.get("/v1/capabilities").json()["bundle"]["ociDigest"] == v1.oci_digest
            answer = client.post("/v1/runs", json={"inputs": {"x": "go"}})
            assert answer.status_code == 200 and answer.json()["outputs"]["v"] == 1, answer.text
        _terminate(process)
        assert process.wait(DEADLINE_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        process.stderr.close()
