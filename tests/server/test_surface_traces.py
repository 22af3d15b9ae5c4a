"""Every serving surface's runs are traced as /v1/runs's are (in-process, spans exported to a real OTLP/HTTP
receiver): the run's `invoke_agent` span names the sealed digest, and a caller's `traceparent` is the
parent of the request's span, which holds the run's."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
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
from tests.support.flows import llm_config
from tests.support.otlp import Receiver, otlp_receiver
from tests.support.threaded_model import threaded_model

BASE = "http://127.0.0.1"
MCP_VERSION = "2026-07-28"
MCP_META = {"io.modelcontextprotocol/protocolVersion": MCP_VERSION, "io.modelcontextprotocol/clientCapabilities": {}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": MCP_VERSION,
               "Mcp-Method": "tools/call", "Mcp-Name": "greeter"}
# One request a surface: (method path, body, headers), each answered by a run of the agent.
REQUESTS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "runs": ("/v1/runs", {"message": "hi"}, {}),
    "mcp": ("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "greeter", "arguments": {"message": "hi"}, "_meta": MCP_META}}, MCP_HEADERS),
    "a2a": ("/a2a", {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                     "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}},
            {"A2A-Version": "1.0"}),
    "responses": ("/v1/responses", {"model": "greeter", "input": "hi"}, {}),
    "ag-ui": ("/v1/runs?protocol=ag-ui", {"message": "hi"}, {}),
}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with otlp_receiver() as found:
        for name in list(os.environ):
            if name.startswith("OTEL_"):
                monkeypatch.delenv(name)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", found.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        yield found


def _ancestors(span: dict[str, Any], spans: list[dict[str, Any]]) -> list[str]:
    """The span ids above `span`, nearest first, ending with the id of a parent that is not among `spans`."""
    by_id = {s["span_id"]: s for s in spans}
    found, parent = [], span["parent_span_id"]
    while parent is not None:
        found.append(parent)
        above = by_id.get(parent)
        parent = above["parent_span_id"] if above is not None else None
    return found


def test_every_surface_exports_the_runs_span_under_its_callers_traceparent(tmp_path: Path,
                                                                          receiver: Receiver) -> None:
    with threaded_model([{"content": "Hello."}], loop=True) as model:
        doc = {"component_type": "Agent", "agentspec_version": "26.1.0", "id": "greeter", "name": "greeter",
               "description": "Says hello.", "llm_config": llm_config(model.url), "system_prompt": "Greet.",
               "tools": []}
        (tmp_path / "greeter.json").write_text(json.dumps(doc))
        key = generate(tmp_path / "me", None)
        bundle = heddle.seal(tmp_path / "greeter.json", sign_key=key.private_path,
                             output=tmp_path / "greeter.heddle").path
        config = ServerConfig(bundle=str(bundle), trust=(key.public_path,), settings=RunSettings())
        service = Service(config, sealed=open_served(config, TrustPolicy.from_names((key.public_path,),
                                                                                    allow_unsigned=False)))
        digest = service.sealed.digest
        callers: dict[str, tuple[str, str]] = {}

        async def main() -> None:
            try:
                transport = httpx.ASGITransport(app=build_app(service))
                async with httpx.AsyncClient(transport=transport, base_url=BASE, timeout=30) as http:
                    # Each surface twice: a surface that kept the first request's context would put the
                    # second run in the first caller's trace.
                    for turn in range(2):
                        for n, (surface, (path, body, headers)) in enumerate(REQUESTS.items()):
                            trace, span = f"{turn + 1:02x}{n + 1:02x}" + "ab" * 14, f"{turn + 1:02x}{n + 1:02x}" * 4
                            callers[f"{surface}#{turn}"] = (trace, span)
                            answer = await http.post(path, json=body,
                                                     headers={**headers, "traceparent": f"00-{trace}-{span}-01"})
                            assert answer.status_code == 200, (surface, answer.text)
            finally:
                await service.aclose()

        asyncio.run(main())
        spans = receiver.wait_for("invoke_agent greeter")
        for _ in range(100):  # every run's spans, flushed in batches
            if len(receiver.named("invoke_agent greeter")) >= 2 * len(callers):
                break
            spans = receiver.wait_for("invoke_agent greeter")
            time.sleep(0.05)

    # The run's own span (an Agent's run holds one more, of its AgentNode, below it).
    runs = [s for s in receiver.named("invoke_agent greeter")
            if not any(p["name"] == "invoke_agent greeter" for p in spans if p["span_id"] == s["parent_span_id"])]
    for who, (trace, span) in callers.items():
        mine = [s for s in runs if s["trace_id"] == trace]
        assert len(mine) == 1, f"{who}: runs in its trace: {len(mine)}"
        run = mine[0]
        assert run["attributes"]["heddle.bundle.digest"] == digest, who
        assert run["attributes"]["heddle.bundle.signer"] == [key.keyid], who
        assert _ancestors(run, spans)[-1] == span, who
    assert len(runs) == len(callers)
