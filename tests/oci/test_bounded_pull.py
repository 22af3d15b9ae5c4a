"""`heddle pull` against a registry written here that misbehaves: one that drips bytes (in its body,
or in its headers) fails at the overall deadline `--transfer-timeout` sets, and a manifest or layer
of a few KiB that decodes to gigabytes is refused while the pull's memory stays where it was; a
redirect to anything but http(s) is one line, exit 2."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from heddle.oci.artifact import BUNDLE_DIGEST, build_manifest
from tests.support.bombs import zstd_bomb
from tests.support.cli import BIN, env_with
from tests.support.cli_inproc import heddle_inproc

pytestmark = pytest.mark.timeout(60)

LAYER = b"not really a bundle, and never read this far" * 20
LAYER_DIGEST = "sha256:" + hashlib.sha256(LAYER).hexdigest()
MANIFEST = build_manifest(layer_digest=LAYER_DIGEST, layer_size=len(LAYER),
                          annotations={BUNDLE_DIGEST: "sha256:" + "0" * 64}, title="x.heddle")
BOMB = zstd_bomb(2 << 30)  # 64 KiB on the wire, 2 GiB decoded
REDIRECTS = {"data": "data:text/plain,hello", "escape": "data:text/plain,\x1b[31mhello", "file": "file:///etc/passwd",
             "bad": "http://[::1"}


class Registry(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        # /v2/<case>/manifests/<tag> and /v2/<case>/blobs/<digest>
        parts = self.path.split("/")
        case, kind = parts[2], parts[3]
        try:
            if case == "drip" and kind == "manifests":
                self._head(200, "application/vnd.oci.image.manifest.v1+json")
                self._drip(b'{"schemaVersion": 2' + b" " * 100000)
            elif case == "driphead":
                self.wfile.write(b"HTTP/1.0 200 OK\r\n")
                self._drip(b"X-Slow: " + b"a" * 60000)
            elif case == "bombmanifest" and kind == "manifests":
                self._head(200, "application/vnd.oci.image.manifest.v1+json", "zstd")
                self.wfile.write(BOMB)
            elif kind == "manifests" and case in REDIRECTS:
                self.send_response(302)
                self.send_header("Location", REDIRECTS[case])
                self.end_headers()
            elif kind == "manifests":
                self._head(200, "application/vnd.oci.image.manifest.v1+json")
                self.wfile.write(MANIFEST)
            elif case == "bomblayer" and kind == "blobs":
                # Asked for identity, sent zstd anyway, with no length: read until the cap.
                self._head(200, "application/octet-stream", "zstd")
                self.wfile.write(BOMB)
            else:
                self._head(404, "application/json")
        except OSError:
            pass

    def _head(self, status: int, kind: str, coding: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        if coding:
            self.send_header("Content-Encoding", coding)
        self.end_headers()

    def _drip(self, data: bytes) -> None:
        for i in range(len(data)):
            self.wfile.write(data[i:i + 1])
            self.wfile.flush()
            time.sleep(0.05)


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def pull(tmp_path: Path, ref: str, *args: str) -> tuple[int, str, int]:
    """Run `heddle pull REF -o OUT ARGS`: its exit code, its stderr and its peak RSS in KiB."""
    for name in ("cache", "home"):
        (tmp_path / name).mkdir(exist_ok=True)
    env = env_with({"HEDDLE_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path / "home")})
    err = tmp_path / f"pull-{time.monotonic_ns()}.err"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen([str(BIN / "heddle"), "pull", ref, "-o", str(tmp_path / "out.heddle"), *args],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, err.read_text(errors="replace"), usage.ru_maxrss


def pull_here(tmp_path: Path, ref: str, *args: str, capsys: pytest.CaptureFixture[str],
              monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """`pull`'s exit code and stderr, by the CLI's entry function in this process: for the cases whose
    kin runs as a real process (the same client, deadline and error line, without a start-up each)."""
    for name in ("cache", "home"):
        (tmp_path / name).mkdir(exist_ok=True)
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code, _, err = heddle_inproc(capsys, "pull", ref, "-o", tmp_path / "out.heddle", *args)
    return code, err


@pytest.mark.parametrize("case", ["drip", "driphead", "url"])
def test_a_registry_that_drips_bytes_fails_at_the_deadline(tmp_path: Path, registry: str, case: str,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A bundle URL is downloaded under the same deadline: here one whose server drips its body.
    ref = f"http://{registry}/v2/drip/manifests/v1" if case == "url" else f"oci://{registry}/{case}:v1"
    if case == "drip":  # a real process, as a user runs it
        code, err, _ = pull(tmp_path, ref, "--transfer-timeout", "1s")
    else:
        code, err = pull_here(tmp_path, ref, "--transfer-timeout", "1s", capsys=capsys, monkeypatch=monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0] == f"error: {ref}: the transfer did not finish within 1 s (--transfer-timeout)", err


def test_a_tiny_manifest_or_layer_that_decodes_huge_is_refused_without_memory(tmp_path: Path,
                                                                             registry: str) -> None:
    code, err, baseline = pull(tmp_path, f"oci://{registry}/missing:v1")
    assert code == 2 and "not found" in err, err
    code, err, manifest_peak = pull(tmp_path, f"oci://{registry}/bombmanifest:v1")
    lines = err.strip().splitlines()
    assert code == 7 and len(lines) == 1 and "the OCI manifest is over 4194304 bytes" in lines[0], err
    code, err, layer_peak = pull(tmp_path, f"oci://{registry}/bomblayer:v1")
    lines = err.strip().splitlines()
    assert code == 6 and len(lines) == 1, err
    assert f"the blob is longer than the {len(LAYER)} bytes its manifest says; it was not used" in lines[0], err
    assert not (tmp_path / "out.heddle").exists()
    assert manifest_peak - baseline < 50 * 1024 and layer_peak - baseline < 50 * 1024, (baseline, manifest_peak,
                                                                                        layer_peak)


@pytest.mark.parametrize("case", sorted(REDIRECTS))
def test_a_redirect_to_anything_but_http_is_one_line(tmp_path: Path, registry: str, case: str,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ref = f"oci://{registry}/{case}:v1"
    if case == "escape":  # a real process's stderr, where an escape would reach a terminal
        code, err, _ = pull(tmp_path, ref)
    else:
        code, err = pull_here(tmp_path, ref, capsys=capsys, monkeypatch=monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "\x1b" not in err
