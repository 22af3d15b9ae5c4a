"""Real clients against real processes: the `mcp` client over streamable HTTP (both protocol eras) and the
`openai` client against one `heddle-server --bundle`, and the `mcp` client over stdio against `heddle mcp`,
each holding a conversation of two turns with the sealed clerk: a tool call, then a payment a person
approves. The error paths are in-process (tests/server/test_surfaces.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from tests.server.support import Server, start_server
from tests.server.surface_agent import CONVERSATION, KEY_ENV, SealedAgent, script_next, seal_agent
from tests.support.cli import BIN, env_with
from tests.support.threaded_model import ThreadedModel, threaded_model

ASKED = 'Approve the call of the tool \'pay\' with {"amount": 5}?'


@pytest.fixture(scope="module")
def model() -> Iterator[ThreadedModel]:
    with threaded_model([]) as served:
        yield served


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, model: ThreadedModel) -> SealedAgent:
    return seal_agent(tmp_path_factory.mktemp("clerk"), model.url)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, agent: SealedAgent) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("server")
    started = start_server(root, "--bundle", agent.bundle, "--trust", agent.pub, "--session-store", "sqlite",
                           "--session-db", root / "sessions.db", env=KEY_ENV)
    try:
        yield started
    finally:
        assert started.stop() == 0
        assert "Traceback" not in started.stderr()


def approving(asked: list[str]) -> Any:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    return elicit


async def converse(client: Client) -> None:
    """The two turns: a tool call, then a payment approved through the client's elicitation callback."""
    (tool,) = (await client.list_tools()).tools
    assert tool.name == "clerk" and (tool.meta or {})["dev.heddle/bundle"]["toolFingerprints"].keys() == {
        "lookup", "pay"}
    first = await client.call_tool("clerk", {"message": "Where is the ladder?"})
    assert first.structured_content == {"result": "In the shed."} and not first.is_error, first
    handle = (first.meta or {})["dev.heddle/session"]
    second = await client.call_tool("clerk", {"message": "Pay 5.", "session": handle})
    assert second.structured_content == {"result": "Paid 5."} and not second.is_error, second
    text = second.content[0]
    assert isinstance(text, types.TextContent) and text.text == "Paid 5."


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_mcp_client_over_streamable_http(server: Server, agent: SealedAgent, model: ThreadedModel,
                                             mode: str) -> None:
    asked: list[str] = []
    script_next(model.app, CONVERSATION)
    before = agent.payments()

    async def main() -> None:
        async with Client(f"{server.url}/mcp", mode=mode, elicitation_callback=approving(asked)) as client:
            # The stateless era when the client probes for it (server/discover), else the handshake.
            assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
            await converse(client)

    asyncio.run(main())
    assert asked == [ASKED] and agent.payments() == before + 1


def test_the_openai_client_against_the_responses_surface(server: Server, agent: SealedAgent,
                                                         model: ThreadedModel) -> None:
    import openai  # here: ~0.7 s of CPU that every xdist worker would otherwise pay at collection

    script_next(model.app, CONVERSATION)
    before = agent.payments()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="not-needed", max_retries=0)
    assert [m.id for m in client.models.list()] == ["clerk"]

    first = client.responses.create(model="clerk", input="Where is the ladder?")
    assert first.output_text == "In the shed."
    assert [item.type for item in first.output] == ["mcp_call", "message"]

    # The second turn streamed: it stops at the payment, asking for approval in the API's own shape.
    with client.responses.create(model="clerk", input="Pay 5.", previous_response_id=first.id,
                                 stream=True) as stream:
        events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    second = events[-1].response
    (request,) = [item for item in second.output if item.type == "mcp_approval_request"]
    assert request.name == "pay" and json.loads(request.arguments) == {"amount": 5}
    assert agent.payments() == before

    third = client.responses.create(model="clerk", previous_response_id=second.id, input=[
        {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}])
    assert third.output_text == "Paid 5." and agent.payments() == before + 1
    with pytest.raises(openai.ConflictError):  # an earlier turn continues nothing
        client.responses.create(model="clerk", input="Again?", previous_response_id=first.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="clerk", input="hi", temperature=0.1)
    assert refused.value.code == "unsupported_parameter" and refused.value.param == "temperature"


def test_the_mcp_client_over_stdio_against_heddle_mcp(tmp_path: Path, agent: SealedAgent,
                                                      model: ThreadedModel) -> None:
    asked: list[str] = []
    script_next(model.app, CONVERSATION)
    params = StdioServerParameters(command=str(BIN / "heddle"), args=[
        "mcp", str(agent.bundle), "--trust", str(agent.pub), "--session-store", "sqlite",
        "--session-db", str(tmp_path / "sessions.db")], env=env_with(KEY_ENV), cwd=str(tmp_path))

    async def main() -> None:
        async with Client(params, mode="legacy", elicitation_callback=approving(asked)) as client:
            assert client.protocol_version == "2025-11-25"  # what desktop clients speak over stdio today
            await converse(client)

    asyncio.run(main())
    assert asked == [ASKED]


def test_heddle_mcp_verifies_the_bundle_before_anything_runs(agent: SealedAgent,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.cli_inproc import heddle_inproc

    status, out, err = heddle_inproc(capsys, "mcp", agent.bundle)
    assert status == 4 and out == ""  # signed by no trusted key: refused as `heddle run` refuses it
    assert err.startswith("error: ") and "--trust" in err
    status, out, err = heddle_inproc(capsys, "mcp", agent.bundle.with_name("clerk.json"))
    assert status == 2 and out == "" and "seal it first" in err
