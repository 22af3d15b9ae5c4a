"""The MCP and OpenAI Responses surfaces in-process (the app through ASGITransport, the real `mcp` client
over it, a sqlite session store): a conversation with a tool call and an approval in each MCP era, and
each surface honouring what /v1/runs honours (admission, drain, the Host guard, authentication,
metrics), every refusal in that protocol's own shape, never a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from heddle.format.trust import TrustPolicy
from heddle.server.app import build_app
from heddle.server.config import ServerConfig
from heddle.server.served_bundle import open_served
from heddle.server.service import Service
from heddle.settings import RunSettings
from tests.server.support import metric
from tests.server.surface_agent import CONVERSATION, PAY, SealedAgent, script_next, seal_agent
from tests.support.threaded_model import ThreadedModel, threaded_model

BASE = "http://127.0.0.1"
TOKEN = "surface-token"


@pytest.fixture(scope="module")
def model() -> Any:
    with threaded_model([]) as served:
        yield served


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, model: ThreadedModel) -> SealedAgent:
    return seal_agent(tmp_path_factory.mktemp("clerk"), model.url)


def served(agent: SealedAgent, tmp_path: Path, *, sessions: bool = True, **config: Any) -> Service:
    settings = RunSettings(session_store="sqlite", session_db=tmp_path / "sessions.db") if sessions else RunSettings()
    server_config = ServerConfig(bundle=str(agent.bundle), trust=(agent.pub,), settings=settings, **config)
    trust = TrustPolicy.from_names((agent.pub,), allow_unsigned=False)
    return Service(server_config, sealed=open_served(server_config, trust))


def run(service: Service, test: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        app = build_app(service)
        try:
            await test(app)
        finally:
            await service.aclose()

    asyncio.run(main())


@asynccontextmanager
async def mcp_client(app: Any, mode: str, **options: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=BASE, headers=headers, timeout=30)
    async with http, Client(streamable_http_client(f"{BASE}/mcp", http_client=http), mode=mode,
                            **options) as client:
        yield client


def approve(answers: list[str]) -> Any:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        answers.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    return elicit


def session_of(result: types.CallToolResult) -> str:
    assert result.meta is not None
    handle = result.meta["dev.heddle/session"]
    assert isinstance(handle, str)
    return handle


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_an_mcp_client_of_either_era_holds_a_conversation_with_a_tool_call(
        agent: SealedAgent, model: ThreadedModel, tmp_path: Path, mode: str) -> None:
    """In the 2026 era the second turn's payment is approved through an input_required round trip; a
    handshake-era elicitation needs a transport that streams (tests/server/test_surfaces_e2e.py)."""
    service = served(agent, tmp_path, auth_token=TOKEN)
    modern = mode != "legacy"

    async def test(app: Any) -> None:
        asked: list[str] = []
        script_next(model.app, CONVERSATION if modern else [*CONVERSATION[:2], {"content": "Paid 5."}])
        before = agent.payments()
        async with mcp_client(app, mode, elicitation_callback=approve(asked)) as client:
            (tool,) = (await client.list_tools()).tools
            assert tool.name == "clerk" and tool.description == "A clerk who finds things and pays for them."
            assert tool.input_schema["required"] == ["message"]
            assert set(tool.input_schema["properties"]) == {"message", "session"}
            proof = (tool.meta or {})["dev.heddle/bundle"]
            assert proof["digest"] == service.capabilities()["bundle"]["digest"]
            assert proof["signers"] == list(service.sealed.signers) and set(proof["toolFingerprints"]) == {
                "lookup", "pay"}

            first = await client.call_tool("clerk", {"message": "Where is the ladder?"})
            assert not first.is_error, first
            assert first.structured_content == {"result": "In the shed."}
            assert isinstance(first.content[0], types.TextContent) and first.content[0].text == "In the shed."
            second = await client.call_tool("clerk", {"message": "Pay 5.", "session": session_of(first)})
            assert not second.is_error, second
            assert second.structured_content == {"result": "Paid 5."}
            assert asked == (['Approve the call of the tool \'pay\' with {"amount": 5}?'] if modern else [])
            assert agent.payments() == before + modern
            # The second turn's model saw the first: one conversation, carried by the handle.
            sent = [m.get("content") for m in model.requests()[-1]["body"]["messages"]]
            assert "Where is the ladder?" in sent and "In the shed." in sent

            # A handle of an earlier turn continues nothing; one not minted here is unknown.
            stale = await client.call_tool("clerk", {"message": "Again?", "session": session_of(first)})
            assert stale.is_error and "not the latest turn" in stale.content[0].text  # type: ignore[union-attr]
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("clerk", {"message": "Hi", "session": "h1.abc.1." + "0" * 32})
            assert unknown.value.error.code == types.INVALID_PARAMS and "not one this server issued" in str(
                unknown.value)
            # Bad input is a tool error a model can read.
            bad = await client.call_tool("clerk", {"session": session_of(second)})
            assert bad.is_error and "message" in bad.content[0].text  # type: ignore[union-attr]
            with pytest.raises(MCPError) as no_tool:
                await client.call_tool("other", {})
            assert no_tool.value.error.code == types.INVALID_PARAMS

    run(service, test)


def test_the_mcp_surface_is_admitted_drained_guarded_and_authenticated_as_v1_runs(
        agent: SealedAgent, tmp_path: Path) -> None:
    service = served(agent, tmp_path, auth_token=TOKEN, max_concurrent=1)

    async def test(app: Any) -> None:
        async with mcp_client(app, "2026-07-28") as client:
            ticket = service.admission.admit()  # the one run slot taken
            try:
                with pytest.raises(MCPError) as busy:
                    await client.call_tool("clerk", {"message": "hi"})
            finally:
                ticket.release()
            assert busy.value.error.code == -32000 and busy.value.error.data["status"] == 429
            service.admission.start_draining()
            with pytest.raises(MCPError) as draining:
                await client.call_tool("clerk", {"message": "hi"})
            assert draining.value.error.code == -32000 and draining.value.error.data["status"] == 503
            assert service.sessions is not None and await service.sessions.index() == []  # none made for nothing
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            unauthenticated = await http.post("/mcp", json=body)
            assert unauthenticated.status_code == 401
            foreign = await http.post("/mcp", json=body, headers={"Host": "evil.example",
                                                                  "Authorization": f"Bearer {TOKEN}"})
            assert foreign.status_code == 421
            page = await http.post("/mcp", json=body, headers={"Origin": "https://evil.example",
                                                               "Authorization": f"Bearer {TOKEN}"})
            assert page.status_code == 403
            text = (await http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).text
            assert metric(text, "heddle_runs_rejected_total", 'reason="busy"') == 1
            assert metric(text, "heddle_runs_rejected_total", 'reason="draining"') == 1

    run(service, test)


def test_a_server_not_serving_mcp_or_responses_has_no_such_routes(agent: SealedAgent, tmp_path: Path) -> None:
    service = served(agent, tmp_path, serve="runs")

    async def test(app: Any) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
            for method, path in (("POST", "/mcp"), ("POST", "/v1/responses"), ("GET", "/v1/models")):
                assert (await http.request(method, path, json={})).status_code == 404

    run(service, test)


# ---------------------------------------------------------------------------------- Responses


def openai_error(response: httpx.Response) -> tuple[int, str, str | None]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return response.status_code, error["code"], error["param"]


def test_the_responses_surface_refuses_in_its_own_shape_and_honours_admission_drain_and_guard(
        agent: SealedAgent, tmp_path: Path) -> None:
    service = served(agent, tmp_path, max_concurrent=1)

    async def test(app: Any) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
            models = (await http.get("/v1/models")).json()
            assert [m["id"] for m in models["data"]] == ["clerk"]
            assert models["data"][0]["heddle"]["digest"] == service.capabilities()["bundle"]["digest"]

            async def post(body: dict[str, Any], **kw: Any) -> httpx.Response:
                return await http.post("/v1/responses", json={"model": "clerk", **body}, **kw)

            assert openai_error(await post({"input": "hi", "temperature": 0.2})) == (
                400, "unsupported_parameter", "temperature")
            assert openai_error(await post({"input": "hi", "instructions": "be brief"}))[1:] == (
                "unsupported_parameter", "instructions")
            assert openai_error(await http.post("/v1/responses", json={"model": "gpt-5", "input": "hi"})) == (
                404, "model_not_found", "model")
            assert openai_error(await post({"input": [{"role": "assistant", "content": "x"}]}))[0] == 400
            assert openai_error(await post({"input": "hi", "previous_response_id": "resp_h1.abc.1." + "0" * 32}))[
                :2] == (404, "unknown_session")
            assert openai_error(await post({"input": "hi", "previous_response_id": "nope"}))[:2] == (
                404, "unknown_response")
            answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}
            assert openai_error(await post({"input": [answer]}))[:2] == (400, "not_waiting")

            ticket = service.admission.admit()
            try:
                busy = await post({"input": "hi"})
                streamed_busy = await post({"input": "hi", "stream": True})
            finally:
                ticket.release()
            assert openai_error(busy)[:2] == (429, "busy") and busy.headers["retry-after"] == "1"
            assert openai_error(streamed_busy)[:2] == (429, "busy")
            assert busy.json()["error"]["type"] == "rate_limit_error"

            assert (await post({"input": "hi"}, headers={"Host": "evil.example"})).status_code == 421
            assert (await post({"input": "hi"}, headers={"Origin": "https://evil.example"})).status_code == 403
            text = await http.post("/v1/responses", content=b"{}", headers={"Content-Type": "text/plain"})
            assert text.status_code == 415
            big = await post({"input": "x" * (service.config.max_body_bytes + 1)})
            assert openai_error(big)[0] == 413  # the server's body cap, in the API's own shape
            assert openai_error(await http.post("/v1/responses", content=b"{nope",
                                                headers={"Content-Type": "application/json"}))[0] == 400

            service.admission.start_draining()
            assert openai_error(await post({"input": "hi"}))[:2] == (503, "draining")
            assert service.sessions is not None and await service.sessions.index() == []  # none made for nothing
            rejected = (await http.get("/metrics")).text
            assert metric(rejected, "heddle_runs_rejected_total", 'reason="busy"') == 2
            assert metric(rejected, "heddle_runs_rejected_total", 'reason="draining"') == 1

    run(service, test)


def test_the_responses_surface_needs_a_token_when_the_server_does(agent: SealedAgent, tmp_path: Path) -> None:
    service = served(agent, tmp_path, auth_token=TOKEN)

    async def test(app: Any) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
            assert (await http.get("/v1/models")).status_code == 401
            refused = await http.post("/v1/responses", json={"model": "clerk", "input": "hi"})
            assert refused.status_code == 401 and "message" in refused.json()["error"]

    run(service, test)


def test_a_responses_turn_is_counted_and_streams_the_responses_events(agent: SealedAgent, model: ThreadedModel,
                                                                     tmp_path: Path) -> None:
    service = served(agent, tmp_path)

    async def test(app: Any) -> None:
        script_next(model.app, CONVERSATION[:2])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE, timeout=30) as http:
            streamed = await http.post("/v1/responses", json={"model": "clerk", "input": "Where?", "stream": True})
            assert streamed.status_code == 200, streamed.text
            events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
            kinds = [e["type"] for e in events]
            assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
            assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
            assert "response.output_text.delta" in kinds
            done = events[-1]["response"]
            assert [i["type"] for i in done["output"]] == ["mcp_call", "message"]
            assert done["output"][0]["name"] == "lookup" and json.loads(done["output"][0]["output"]) == {
                "found": "in the shed"}
            assert done["output"][1]["content"][0]["text"] == "In the shed."
            deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            assert deltas == "In the shed."
            text = (await http.get("/metrics")).text
            assert metric(text, "heddle_runs_accepted_total") == 1
            assert metric(text, "heddle_tool_calls_total", 'outcome="ok",tool="lookup"') == 1

    run(service, test)


def test_an_mcp_wait_outlives_the_client_that_cannot_answer_it_and_a_declined_approval_is_a_denial(
        agent: SealedAgent, model: ThreadedModel, tmp_path: Path) -> None:
    service = served(agent, tmp_path)

    async def decline(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async def test(app: Any) -> None:
        before = agent.payments()
        script_next(model.app, [PAY, {"content": "Paid 5."}, PAY, {"content": "Not paid."}])
        async with mcp_client(app, "2026-07-28") as mute:  # declares no elicitation
            held = await mute.call_tool("clerk", {"message": "Pay 5."})
        assert held.is_error and "Approve the call of the tool 'pay'" in held.content[0].text  # type: ignore[union-attr]
        asked: list[str] = []
        # Another client (another connection, as another replica would get) answers the same wait.
        async with mcp_client(app, "2026-07-28", elicitation_callback=approve(asked)) as able:
            done = await able.call_tool("clerk", {"message": "Pay 5.", "session": session_of(held)})
        assert done.structured_content == {"result": "Paid 5."} and len(asked) == 1
        assert agent.payments() == before + 1
        async with mcp_client(app, "2026-07-28", elicitation_callback=decline) as declining:
            denied = await declining.call_tool("clerk", {"message": "Pay 5 again.", "session": session_of(done)})
        assert denied.structured_content == {"result": "Not paid."}
        assert agent.payments() == before + 1
        told = [m for m in model.requests()[-1]["body"]["messages"] if m["role"] == "tool"]
        assert "declined" in told[-1]["content"]

    run(service, test)


def test_a_responses_approval_denied_runs_nothing_and_an_answer_to_another_call_is_refused(
        agent: SealedAgent, model: ThreadedModel, tmp_path: Path) -> None:
    service = served(agent, tmp_path)

    async def test(app: Any) -> None:
        before = agent.payments()
        script_next(model.app, [PAY, {"content": "Not paid."}])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE, timeout=30) as http:
            async def post(body: dict[str, Any]) -> httpx.Response:
                return await http.post("/v1/responses", json={"model": "clerk", **body})

            first = (await post({"input": "Pay 5."})).json()
            (request,) = [item for item in first["output"] if item["type"] == "mcp_approval_request"]
            assert request["server_label"] == "clerk" and json.loads(request["arguments"]) == {"amount": 5}
            wrong = {"type": "mcp_approval_response", "approval_request_id": "mcpr_other", "approve": True}
            assert openai_error(await post({"input": [wrong], "previous_response_id": first["id"]}))[2] == (
                "input[0].approval_request_id")
            text = await post({"input": "just do it", "previous_response_id": first["id"]})
            assert openai_error(text)[:2] == (400, "waiting")
            no = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False,
                  "reason": "too much"}
            done = await post({"input": [no], "previous_response_id": first["id"]})
            assert done.status_code == 200, done.text
            assert done.json()["output"][-1]["content"][0]["text"] == "Not paid."
            assert done.json()["previous_response_id"] == first["id"]
        assert agent.payments() == before
        told = [m for m in model.requests()[-1]["body"]["messages"] if m["role"] == "tool"]
        assert "too much" in told[-1]["content"]

    run(service, test)


def test_the_served_model_and_arguments_the_agent_does_not_take(agent: SealedAgent, tmp_path: Path) -> None:
    service = served(agent, tmp_path)

    async def test(app: Any) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
            one = await http.get("/v1/models/clerk")
            assert one.status_code == 200 and one.json()["id"] == "clerk" and one.json()["object"] == "model"
            assert openai_error(await http.get("/v1/models/gpt-5"))[:2] == (404, "model_not_found")
        async with mcp_client(app, "2026-07-28") as client:
            odd = await client.call_tool("clerk", {"message": "hi", "colour": "red"})
            assert odd.is_error and "colour" in odd.content[0].text  # type: ignore[union-attr]

    run(service, test)


def test_a_flow_is_one_mcp_tool_of_its_start_inputs_and_its_question_is_asked_and_answered(tmp_path: Path) -> None:
    import heddle
    from heddle.format.keys import generate
    from tests.support.flows import FlowDoc

    f = FlowDoc("paint")
    start = f.start([{"title": "wall", "type": "string", "description": "Which wall"},
                     {"title": "coats", "type": "integer", "default": 2}])
    ask = f._node("InputMessageNode", "ask", [], ["user_input"], message="Which colour?")
    end = f.end(["wall", "user_input"])
    f.control(start, ask)
    f.control(ask, end)
    f.data(start, "wall", end, "wall")
    f.data(ask, "user_input", end, "user_input")
    key = generate(tmp_path / "me", None)
    bundle = heddle.seal(f.write(tmp_path / "paint.json"), sign_key=key.private_path,
                         output=tmp_path / "paint.heddle").path
    service = served(SealedAgent(bundle, key.public_path, tmp_path / "none"), tmp_path)

    async def colour(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert params.message == "Which colour?"
        return types.ElicitResult(action="accept", content={"message": "green"})

    async def test(app: Any) -> None:
        async with mcp_client(app, "2026-07-28", elicitation_callback=colour) as client:
            (tool,) = (await client.list_tools()).tools
            assert tool.name == "paint" and tool.input_schema["required"] == ["wall"]
            assert tool.input_schema["properties"]["wall"] == {"type": "string", "description": "Which wall"}
            assert tool.input_schema["properties"]["coats"] == {"type": "integer", "default": 2}
            done = await client.call_tool("paint", {"wall": "north"})
            assert done.structured_content == {"wall": "north", "user_input": "green"}, done
            assert json.loads(done.content[0].text) == done.structured_content  # type: ignore[union-attr]
            bad = await client.call_tool("paint", {"wall": 3})
            assert bad.is_error and "wall" in bad.content[0].text  # type: ignore[union-attr]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
            refused = await http.post("/v1/responses", json={"model": "paint", "input": "hi"})
            assert openai_error(refused)[:2] == (400, "not_an_agent")

    run(service, test)


def test_after_a_swap_the_mcp_tool_and_the_model_name_the_new_digest_before_any_run_on_it(
        agent: SealedAgent, model: ThreadedModel, tmp_path: Path) -> None:
    from heddle.server.follow import open_edition

    newer = seal_agent(tmp_path / "v2", model.url)  # the same agent sealed again: another digest, another key
    service = served(agent, tmp_path)
    trust = TrustPolicy.from_names((agent.pub, newer.pub), allow_unsigned=False)

    async def test(app: Any) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
            async with mcp_client(app, "2026-07-28") as client:
                before = (await client.list_tools()).tools[0].meta
                old = (await http.get("/v1/models")).json()["data"][0]["heddle"]
                assert before is not None and before["dev.heddle/bundle"] == old
                service.swap(open_edition(service.config, trust, service, newer.bundle, "sha256:v2"))
                after = (await client.list_tools()).tools[0].meta
                new = (await http.get("/v1/models")).json()["data"][0]["heddle"]
            assert after is not None and after["dev.heddle/bundle"] == new
            assert new["digest"] == service.capabilities()["bundle"]["digest"] != old["digest"]
            assert new["signers"] == list(service.sealed.signers) != old["signers"]

    run(service, test)


def test_a_client_tool_is_a_function_call_to_answer_and_over_mcp_a_form(model: ThreadedModel, tmp_path: Path) -> None:
    import heddle
    from heddle.format.keys import generate
    from tests.support.flows import llm_config

    locate = {"component_type": "ClientTool", "id": "locate", "name": "locate", "description": "Where a thing is",
              "inputs": [{"title": "item", "type": "string"}], "outputs": [{"title": "place", "type": "string"}]}
    doc = {"component_type": "Agent", "agentspec_version": "26.1.0", "id": "finder", "name": "finder",
           "llm_config": llm_config(model.url), "system_prompt": "You find.", "tools": [locate]}
    (tmp_path / "finder.json").write_text(json.dumps(doc))
    key = generate(tmp_path / "me", None)
    bundle = heddle.seal(tmp_path / "finder.json", sign_key=key.private_path, output=tmp_path / "f.heddle").path
    service = served(SealedAgent(bundle, key.public_path, tmp_path / "none"), tmp_path)
    call = {"tool_calls": [{"name": "locate", "arguments": {"item": "key"}}]}

    async def shed(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert "locate" in params.message
        return types.ElicitResult(action="accept", content={"result": '{"place": "shed"}'})

    async def test(app: Any) -> None:
        script_next(model.app, [call, {"content": "In the hall."}, call, {"content": "In the shed."}])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
            first = (await http.post("/v1/responses", json={"model": "finder", "input": "Where is my key?"})).json()
            (asked,) = [item for item in first["output"] if item["type"] == "function_call"]
            assert asked["name"] == "locate" and json.loads(asked["arguments"]) == {"item": "key"}
            answer = {"type": "function_call_output", "call_id": asked["call_id"], "output": '{"place": "hall"}'}
            done = await http.post("/v1/responses", json={"model": "finder", "previous_response_id": first["id"],
                                                           "input": [answer]})
            assert done.status_code == 200, done.text
            assert done.json()["output"][-1]["content"][0]["text"] == "In the hall."
        told = [m for m in model.requests()[-1]["body"]["messages"] if m["role"] == "tool"]
        assert "hall" in told[-1]["content"]
        async with mcp_client(app, "2026-07-28", elicitation_callback=shed) as client:
            found = await client.call_tool("finder", {"message": "Where is my key?"})
        assert found.structured_content == {"result": "In the shed."}, found
        told = [m for m in model.requests()[-1]["body"]["messages"] if m["role"] == "tool"]
        assert "shed" in told[-1]["content"]

    run(service, test)
