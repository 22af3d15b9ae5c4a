"""Request flows kept prepared by document (heddle.server.flow_cache), in-process through
httpx.ASGITransport: a flow sent again is not read or prepared again, and every request is still
checked (its inputs, the files the preparation looked at, the model policy's addresses)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle import core
from heddle.engine import run as engine_run
from heddle.server import model_policy
from heddle.server.config import ServerConfig
from heddle.server.flow_cache import FlowCache, Ready
from heddle.server.service import Service
from tests.server.flows import ECHO, agent_flow, one_tool_flow, write_tools
from tests.server.support import in_process

Client = httpx.AsyncClient


def serve(test: Callable[[Client, Service], Awaitable[None]], **config: Any) -> None:
    service = Service(ServerConfig(**config))
    in_process(service, lambda client: test(client, service))


def counted_preparations(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    made: list[object] = []
    real = engine_run.prepare_run

    def prepare_run(flow: Any, **kwargs: Any) -> Any:
        made.append(flow)
        return real(flow, **kwargs)

    # The run core is the engine's one caller (heddle/core.py), under the name it imported.
    monkeypatch.setattr(core, "prepare_run", prepare_run)
    return made


def test_a_flow_sent_again_is_not_prepared_again_and_each_request_is_still_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = write_tools(tmp_path / "tools", {"echo": ECHO})
    flows = tmp_path / "flows"
    flows.mkdir()
    doc = one_tool_flow("kept", "echo").document()
    (flows / "kept.json").write_text(json.dumps(doc), encoding="utf-8")
    made = counted_preparations(monkeypatch)

    async def test(client: Client, service: Service) -> None:
        for x in (1, 2):
            response = await client.post("/v1/runs", json={"flow": doc, "inputs": {"x": x}})
            assert response.status_code == 200, response.text
            assert response.json()["outputs"] == {"x": x}
        assert len(made) == 1 and len(service.flows) == 1
        # The same document with its keys in another order is another document (the order reaches what runs).
        response = await client.post("/v1/runs", json={"flow": dict(reversed(doc.items())), "inputs": {"x": 3}})
        assert response.status_code == 200 and len(made) == 2
        # Kept or not, a request's own inputs are checked.
        response = await client.post("/v1/runs", json={"flow": doc})
        assert response.status_code == 400 and response.json()["error"]["type"] == "missing_input"
        # A tool no longer executable: prepared afresh, and refused as a first request would be.
        (tools / "echo").chmod(0o644)
        response = await client.post("/v1/runs", json={"flow": doc, "inputs": {"x": 4}})
        assert response.status_code == 400 and "is not executable; run chmod +x" in response.text
        assert len(made) == 3
        (tools / "echo").chmod(0o755)
        # flowPath: the file is read for every request, and prepared again only when its bytes change.
        for _ in range(2):
            response = await client.post("/v1/runs", json={"flowPath": "kept.json", "inputs": {"x": 5}})
            assert response.status_code == 200, response.text
        assert len(made) == 4
        (flows / "kept.json").write_text(json.dumps(one_tool_flow("edited", "echo").document()), encoding="utf-8")
        response = await client.post("/v1/runs", json={"flowPath": "kept.json", "inputs": {"x": 6}})
        assert response.status_code == 200 and response.json()["flow"] == "edited" and len(made) == 5

    serve(test, tools_dir=tools, flows_root=flows)


def test_a_kept_flows_model_addresses_are_resolved_for_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = agent_flow("asks", "http://models.example/v1").document()
    answers = iter([[ipaddress.ip_address("93.184.216.34")], [ipaddress.ip_address("10.0.0.7")]])

    async def addresses(host: str, port: int) -> list[Any]:
        return next(answers)

    monkeypatch.setattr(model_policy, "_addresses", addresses)
    made = counted_preparations(monkeypatch)

    async def test(client: Client, service: Service) -> None:
        first = (await client.post("/v1/validate", json={"flow": doc})).json()
        assert first["valid"], first
        second = (await client.post("/v1/validate", json={"flow": doc})).json()
        assert not second["valid"] and "points at 10.0.0.7, an address of this server's own network" in \
            second["problems"][0]
        assert len(made) == 1  # the second was the kept preparation, its address looked up again

    serve(test)


def test_the_cache_is_bounded_keeps_only_successes_and_serves_only_its_edition() -> None:
    edition, other = object(), object()

    def ready(size: int = 10, *, failed: bool = False) -> Ready:
        kept = Ready(flow=object(), edition=edition, size=size)  # type: ignore[arg-type]
        kept.run = object()  # type: ignore[assignment]
        kept.failure = ValueError("no") if failed else None
        return kept

    cache = FlowCache(max_entries=2, max_bytes=100)
    cache.put("a", ready())
    cache.put("b", ready())
    assert cache.get("a", edition) is not None  # "a" used last: "b" goes first
    cache.put("c", ready())
    assert cache.get("b", edition) is None and len(cache) == 2
    cache.put("d", ready(size=95))  # over the bytes: the least recently used go until it fits
    assert cache.get("a", edition) is None and cache.get("c", edition) is None and cache.get("d", edition)
    cache.put("e", ready(failed=True))
    cache.put("f", ready(size=101))
    assert cache.get("e", edition) is None and cache.get("f", edition) is None
    assert cache.get("d", other) is None  # another edition's tools, plugins or settings: never used
