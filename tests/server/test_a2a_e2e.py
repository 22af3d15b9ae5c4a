"""A2A and AG-UI against a real `heddle-server --bundle` process (one for the module): a2a-sdk's client
runs the sealed agent end to end, a tool call through its approval and a second turn of the
conversation, and an AG-UI consumer reads a run's stream as it is sent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.support import Server, start_server
from tests.server.surfaces import PAYING, Sealed, seal_agent
from tests.server.test_a2a import last_task, texts, user
from tests.server.test_agui import consume
from tests.support.threaded_model import threaded_model


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Sealed]]:
    root = tmp_path_factory.mktemp("surfaces")
    with threaded_model([]) as model:
        sealed = seal_agent(root, model)
        server = start_server(root, "--bundle", sealed.path, "--trust", sealed.key.public_path,
                              "--session-store", "sqlite", "--session-db", root / "sessions.db")
        try:
            yield server, sealed
        finally:
            assert server.stop() == 0
            assert "Traceback" not in server.stderr(), server.stderr()


def test_the_sdk_client_pays_with_approval_then_asks_again_over_http(served: tuple[Server, Sealed]) -> None:
    from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
    from a2a.types import TaskState

    server, sealed = served
    sealed.script([*PAYING, {"content": "You paid 5."}])

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            card = await A2ACardResolver(http, server.url).get_agent_card()
            assert card.supported_interfaces[0].url == f"{server.url}/a2a"
            a2a: Any = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
            task, _ = await last_task(a2a, user("Pay 5, please."))
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            done, _ = await last_task(a2a, user(data={"approve": True}, context=task.context_id, task=task.id))
            assert done.status.state == TaskState.TASK_STATE_COMPLETED and texts(done.status.message) == ["Paid 5."]
            again, _ = await last_task(a2a, user("And?", context=task.context_id))
            assert again.id == f"{task.context_id}.2" and texts(again.status.message) == ["You paid 5."]

    asyncio.run(main())


def test_an_ag_ui_consumer_reads_a_run_as_it_streams(served: tuple[Server, Sealed]) -> None:
    from ag_ui.core import EventType

    server, sealed = served
    sealed.script(PAYING)
    with server.client() as client:
        sid = client.post("/v1/sessions").json()["session"]
        with client.stream("POST", "/v1/runs?protocol=ag-ui", json={"session": sid, "message": "Pay 5."}) as response:
            assert response.status_code == 200
            text = "".join(response.iter_text())
        assert consume(text)[-1].outcome.type == "interrupt"
        events = consume(client.post("/v1/runs?protocol=ag-ui", json={"session": sid,
                                                                       "answer": {"approve": True}}).text)
        assert events[-1].type == EventType.RUN_FINISHED and events[-1].result["outputs"]
