"""The server image's entrypoint as processes, against a real registry (tests/support/registry.py):
the Containerfile's ENTRYPOINT (tini, then heddle-server) with the Deployment's arguments and
environment, the pod's folders made as the kubelet makes them (the cache and work volumes sticky tmpfs, the
trusted key read-only). It pulls at start and refuses an
untrusted signer before the port opens; following its tag it swaps in a new digest between
requests and refuses one signed by a key it does not trust; on SIGTERM it drains.

What differs from the pod, and why: the paths (temporary folders), --port 0 (no fixed ports),
--pull-interval 200ms (for 5m), the registry's address, and no --session-store (the Postgres
store has its own tests across two servers, tests/server/test_sessions_replicas.py)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import heddle
import heddle.oci
from heddle.format.keys import generate
from tests.deploy.image import Doc, expand, of_kind, read_image, server_container
from tests.server.flows import one_tool_flow
from tests.support.cli import env_with
from tests.support.flows import write_script
from tests.support.registry import RunningRegistry, registry  # noqa: F401 (a fixture)
from tests.support.scripted_model import _read_line

DEADLINE_S = 20.0
PREFIX = "heddle-server listening on "


def _tool(version: int, gate: Path) -> str:
    # An input of "hold" keeps the call going until `gate` exists (never past the deadline), so a test
    # can have a run in flight while it moves the tag or signals the server.
    return ("#!/bin/sh\ninput=$(cat)\ncase \"$input\" in *hold*)\n"
            f"  i=0; while [ ! -e {gate} ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done;;\nesac\n"
            f"echo '{{\"v\": {version}}}'\n")


@dataclass(frozen=True)
class Made:
    bundles: dict[str, Path]  # v1 and v2 signed by the trusted key, "untrusted" by another
    pub: Path
    gate: Path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    root = tmp_path_factory.mktemp("image-bundles")
    gate = root / "gate"
    mine, theirs = generate(root / "release", None), generate(root / "stranger", None)
    bundles = {}
    # One flow (one name and id: one agent) in every release; the tool is what changes.
    flow = one_tool_flow("agent", "answer", outputs=("v",)).write(root / "agent.json")
    for name, version, key in (("v1", 1, mine), ("v2", 2, mine), ("untrusted", 3, theirs)):
        tools = root / f"tools-{name}"
        write_script(tools, "answer", _tool(version, gate))
        bundles[name] = heddle.seal(flow, tools_dir=tools, sign_key=key.private_path,
                                    output=root / f"{name}.heddle").path
    return Made(bundles, mine.public_path, gate)


@dataclass
class Pod:
    """The pod's folders, and the command and environment its container starts with."""

    root: Path
    argv: list[str]
    env: dict[str, str]


def _pod(root: Path, made: Made, bundle: str, *, interval: str | None = None) -> Pod:
    """The image's ENTRYPOINT and the Deployment's args and env, the pod's paths under `root`."""
    image = read_image()
    deployment: Doc = of_kind("Deployment", "")[0]  # the stateless one: see the module's docstring
    container = server_container(deployment)
    volumes = {"/var/cache/heddle": root / "cache-volume", "/var/lib/heddle/work": root / "work-volume",
               "/etc/heddle/trust": root / "trust-volume", "/var/lib/heddle/home": root / "home"}
    for path in volumes.values():
        path.mkdir(parents=True)
    os.chmod(volumes["/var/cache/heddle"], 0o1777)  # a memory emptyDir: a tmpfs, sticky like /tmp
    os.chmod(volumes["/var/lib/heddle/work"], 0o1777)  # a memory emptyDir too
    shutil.copy(made.pub, volumes["/etc/heddle/trust"] / "release.pub")
    os.chmod(volumes["/etc/heddle/trust"] / "release.pub", 0o444)

    def local(text: str) -> str:
        for inside, outside in volumes.items():
            text = text.replace(inside, str(outside))
        return text

    env = {name: local(value) for name, value in image.env.items()}
    env.update({e["name"]: local(e["value"]) for e in container["env"] if "value" in e})
    env.update(POD_NAMESPACE="heddle", HEDDLE_AUTH_TOKEN=secrets.token_hex(16))
    args = []
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        if flag == "--bundle":
            arg = f"--bundle={bundle}"
        elif flag == "--pull-interval":
            if interval is None:
                continue
            arg = f"--pull-interval={interval}"
        args.append(local(expand(arg, env)))
    entry = [local(a) for a in image.entrypoint]
    entry[entry.index("--port") + 1] = "0"
    return Pod(root, entry + args, env)


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    url: str
    token: str
    stderr_path: Path

    def client(self) -> httpx.Client:
        port = self.url.rsplit(":", 1)[1]
        return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=DEADLINE_S,
                            headers={"Authorization": f"Bearer {self.token}"})

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@pytest.fixture
def start() -> Iterator[Callable[[Pod], Started]]:
    started: list[Started] = []

    def begin(pod: Pod) -> Started:
        stderr_path = pod.root / "stderr"
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(pod.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                       env=env_with(pod.env), cwd=pod.root)
        line = _read_line(process, time.monotonic() + DEADLINE_S).decode(errors="replace").strip()
        if not line.startswith(PREFIX):
            process.kill()
            process.wait()
            raise AssertionError(f"the entrypoint did not start: {line!r}; {stderr_path.read_text()[-2000:]}")
        one = Started(process, line[len(PREFIX):], pod.env["HEDDLE_AUTH_TOKEN"], stderr_path)
        started.append(one)
        return one

    yield begin
    for one in started:
        if one.process.poll() is None:
            one.process.kill()
            one.process.wait()
        assert one.process.stdout is not None
        one.process.stdout.close()


def _require_tini() -> None:
    if shutil.which(read_image().entrypoint[0]) is None:
        pytest.skip(f"{read_image().entrypoint[0]} is not installed; scripts/test installs it, or: apt-get install "
                    "tini")


def _until(what: Callable[[], Any], why: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        found = what()
        if found:
            return found
        assert time.monotonic() < deadline, why
        time.sleep(0.02)


def test_the_entrypoint_refuses_an_untrusted_signer_before_the_port_opens(
        tmp_path: Path, made: Made, registry: RunningRegistry) -> None:  # noqa: F811
    _require_tini()
    heddle.oci.push(made.bundles["untrusted"], registry.ref("agent:stranger"))
    pod = _pod(tmp_path, made, registry.ref("agent:stranger"))
    done = subprocess.run(pod.argv, check=False, capture_output=True, text=True, env=env_with(pod.env), cwd=tmp_path,
                          timeout=DEADLINE_S, stdin=subprocess.DEVNULL)
    assert done.returncode == 4, done.stderr
    assert PREFIX not in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "trust" in errors[0], errors[0]


def test_a_following_pod_swaps_a_moved_tag_refuses_an_untrusted_one_and_drains_on_sigterm(
        tmp_path: Path, made: Made, registry: RunningRegistry,  # noqa: F811
        start: Callable[[Pod], Started]) -> None:
    _require_tini()
    tag = registry.ref("agent:prod")
    v1 = heddle.oci.push(made.bundles["v1"], tag)
    server = start(_pod(tmp_path, made, tag, interval="200ms"))
    with server.client() as client:

        def caps() -> dict[str, Any]:
            body: dict[str, Any] = client.get("/v1/capabilities").json()
            return body

        def run(x: str = "go") -> Any:
            response = client.post("/v1/runs", json={"inputs": {"x": x}})
            assert response.status_code == 200, response.text
            return response.json()["outputs"]["v"]

        assert caps()["follow"]["ociDigest"] == v1.oci_digest and run() == 1
        v2 = heddle.oci.push(made.bundles["v2"], tag)
        _until(lambda: caps()["bundle"]["digest"] == v2.bundle_digest, "the moved tag was never followed")
        assert caps()["bundle"]["ociDigest"] == v2.oci_digest and run() == 2

        bad = heddle.oci.push(made.bundles["untrusted"], tag)
        refusal = _until(lambda: caps()["follow"]["lastRefusal"], "the untrusted digest was never refused")
        assert refusal["ociDigest"] == bad.oci_digest and refusal["kind"] == "untrusted_signer", refusal
        assert client.get("/readyz").status_code == 200
        assert caps()["bundle"]["digest"] == v2.bundle_digest and run() == 2
        metrics = client.get("/metrics").text
        assert f'heddle_bundle_last_refusal_info{{oci_digest="{bad.oci_digest}",reason="untrusted_signer"}} 1.0' \
            in metrics

        # SIGTERM to tini reaches heddle-server: a run in flight finishes, a new one is refused, then exit 0.
        with httpx.Client(base_url=client.base_url, timeout=DEADLINE_S, headers=dict(client.headers)) as other, \
                ThreadPoolExecutor(1) as pool:
            held = pool.submit(other.post, "/v1/runs", json={"inputs": {"x": "hold"}})
            _until(lambda: caps()["runsInFlight"] == 1, "the held run never started")
            server.process.send_signal(signal.SIGTERM)
            _until(lambda: client.get("/readyz").status_code == 503, "readiness never turned 503")
            assert client.post("/v1/runs", json={"inputs": {"x": "go"}}).status_code == 503
            made.gate.touch()
            answer = held.result(DEADLINE_S)
    assert answer.status_code == 200 and answer.json()["outputs"]["v"] == 2, answer.text
    assert server.process.wait(DEADLINE_S) == 0
    stderr = server.stderr()
    assert "Traceback" not in stderr and f"refused {tag} at {bad.oci_digest}" in stderr, stderr

