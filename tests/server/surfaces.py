"""A sealed agent for the protocol surfaces' tests: an Agent document whose one tool, `pay`, waits for a
person's approval, sealed and signed, its model the scripted one on a thread of the test process."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import heddle
from heddle.format.keys import GeneratedKey, generate
from heddle.format.trust import TrustPolicy
from heddle.server.app import build_app
from heddle.server.config import ServerConfig
from heddle.server.served_bundle import open_served
from heddle.server.service import Service
from heddle.settings import RunSettings
from tests.support.flows import llm_config, write_script
from tests.support.threaded_model import ThreadedModel

Client = httpx.AsyncClient
BASE = "http://127.0.0.1"
PAY = "#!/bin/sh\ncat >/dev/null\necho '{\"paid\": 5}'\n"
# The model asks to pay 5 (which waits for approval), then answers; a second turn is one answer.
PAYING = [{"tool_calls": [{"name": "pay", "arguments": {"amount": 5}}]}, {"content": "Paid 5."}]


def agent_document(url: str, name: str = "cashier") -> dict[str, Any]:
    pay = {"component_type": "ServerTool", "id": "pay-tool", "name": "pay", "description": "Pay an amount.",
           "inputs": [{"title": "amount", "type": "integer"}], "outputs": [{"title": "paid", "type": "integer"}],
           "requires_confirmation": True}
    return {"component_type": "Agent", "agentspec_version": "26.1.2", "id": f"agent-{uuid.uuid4().hex[:6]}",
            "name": name, "description": "Takes payments.", "inputs": [], "outputs": [],
            "llm_config": llm_config(url), "system_prompt": "You help.", "tools": [pay]}


@dataclass
class Sealed:
    path: Path
    key: GeneratedKey
    model: ThreadedModel

    def script(self, entries: list[dict[str, Any]]) -> None:
        """The model's next answers, from the first request on."""
        self.model.app.script = list(entries)
        self.model.app.requests.clear()


def seal_agent(root: Path, model: ThreadedModel, name: str = "cashier", key: GeneratedKey | None = None) -> Sealed:
    import json

    root.mkdir(parents=True, exist_ok=True)
    key = key or generate(root / "me", None)
    tools = root / f"tools-{name}"
    write_script(tools, "pay", PAY)
    doc = root / f"{name}.json"
    doc.write_text(json.dumps(agent_document(model.url, name)), encoding="utf-8")
    path = heddle.seal(doc, tools_dir=tools, sign_key=key.private_path, output=root / f"{name}.heddle").path
    return Sealed(Path(path), key, model)


def service_of(sealed: Sealed, tmp_path: Path, *, sessions: bool = True, **config: Any) -> Service:
    settings = RunSettings(session_store="sqlite", session_db=tmp_path / "sessions.db") if sessions else RunSettings()
    made = ServerConfig(bundle=str(sealed.path), trust=(sealed.key.public_path,), settings=settings, **config)
    trust = TrustPolicy.from_names((sealed.key.public_path,), allow_unsigned=False)
    return Service(made, sealed=open_served(made, trust))


def serve(service: Service, test: Callable[[Client], Awaitable[None]], **headers: str) -> None:
    """`test` with a client of `service`'s app, in-process; the service closed afterwards."""
    async def main() -> None:
        try:
            transport = httpx.ASGITransport(app=build_app(service))
            async with httpx.AsyncClient(transport=transport, base_url=BASE, headers=headers, timeout=30) as client:
                await test(client)
        finally:
            await service.aclose()

    asyncio.run(main())
