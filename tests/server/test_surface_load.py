"""`scripts/load --serve surfaces` in-process: each request the driver sends a surface is one that surface
answers as a run that succeeded, a streamed (chunked) answer is read whole, and each surface's row says what
it adds to /v1/runs against the aim."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import heddle
from heddle.format.keys import generate
from heddle.format.trust import TrustPolicy
from heddle.server.app import build_app
from heddle.server.config import ServerConfig
from heddle.server.served_bundle import open_served
from heddle.server.service import Service
from heddle.settings import RunSettings
from tests.support.threaded_model import threaded_model

LOAD = Path(__file__).resolve().parents[2] / "scripts" / "load.py"


@pytest.fixture(scope="module")
def load() -> Any:
    spec = importlib.util.spec_from_file_location("heddle_load_script", LOAD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_every_surface_request_of_the_driver_is_answered_as_a_run(load: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def sealed_document(root: Path, name: str, document: dict[str, Any]) -> tuple[Path, Path]:
        # In-process rather than by the CLI the driver runs: the same bundle, without two process starts.
        folder = root / name
        folder.mkdir()
        (folder / "flow.json").write_text(json.dumps(document))
        key = generate(folder / "load", None)
        bundle = heddle.seal(folder / "flow.json", sign_key=key.private_path, output=folder / "app.heddle").path
        return Path(bundle), key.public_path

    monkeypatch.setattr(load, "sealed_document", sealed_document)
    with threaded_model([{"content": "Hello."}], loop=True) as model:
        served = load.surfaces_served(tmp_path, {"x": "hello"}, [], model.url)
        assert {one.label for one in served} == {"runs", "mcp", "a2a", "ag-ui", "agent-runs", "responses"}

        async def main() -> None:
            for one in served:
                bundle, trust = Path(one.args[1]), Path(one.args[3])
                config = ServerConfig(bundle=str(bundle), trust=(trust,), settings=RunSettings())
                service = Service(config, sealed=open_served(config, TrustPolicy.from_names(
                    (trust,), allow_unsigned=False)))
                try:
                    transport = httpx.ASGITransport(app=build_app(service))
                    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                                 timeout=30) as http:
                        answer = await http.post(one.path, json=one.body, headers=one.headers)
                    assert load.ANSWERED[one.check](answer.status_code, answer.content), (one.label, answer.text)
                    assert not load.ANSWERED[one.check](500, answer.content), one.label
                finally:
                    await service.aclose()

        asyncio.run(main())


def test_a_chunked_answer_is_read_whole_and_the_rows_say_what_each_surface_adds(load: Any) -> None:
    async def main() -> tuple[int, bytes]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n")
            await writer.drain()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        caller = load.Caller("127.0.0.1", port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        try:
            return await caller.post()
        finally:
            caller.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) == (200, b"hello, world")

    def result(label: str, ms: float) -> Any:
        return load.Result(concurrency=1, runs=3, label=label, ok=3, latencies_ms=[ms] * 3, cpu_s=0.003)

    served = [load.Served("runs", "", [], {}), load.Served("mcp", "", [], {}, base="runs"),
              load.Served("a2a", "", [], {}, base="runs")]
    rows = load.surface_latency([result("runs", 2.0), result("mcp", 3.5), result("a2a", 4.5)], served)
    assert "| mcp (vs runs) | 1 | 3.50 | 2.00 | +1.50 |" in rows and "within 2 ms: met" in rows
    assert "| a2a (vs runs) | 1 | 4.50 | 2.00 | +2.50 |" in rows and "within 2 ms: missed" in rows
