"""A2A 1.0 in-process (the app through httpx.ASGITransport): a2a-sdk's own client runs the sealed agent
(a tool call waiting for approval, two turns of one conversation), the signed card verified by
a2a-sdk's verifier and renewed by a swap, and every error path in the binding's own shape."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.surfaces import BASE, PAYING, Client, Sealed, seal_agent, serve, service_of
from tests.support.threaded_model import threaded_model


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with threaded_model([]) as model:
        yield seal_agent(tmp_path_factory.mktemp("a2a"), model)


def a2a_client(client: Client, card: Any, *, streaming: bool, binding: str = "JSONRPC") -> Any:
    from a2a.client import ClientConfig, ClientFactory

    config = ClientConfig(httpx_client=client, streaming=streaming, supported_protocol_bindings=[binding])
    return ClientFactory(config).create(card)


def user(text: str | None = None, data: dict[str, Any] | None = None, *, context: str = "", task: str = "") -> Any:
    from a2a.types import Message, Part, Role, SendMessageRequest
    from google.protobuf.json_format import ParseDict
    from google.protobuf.struct_pb2 import Value

    parts = [Part(text=text)] if text is not None else []
    if data is not None:
        parts.append(Part(data=ParseDict(data, Value())))
    return SendMessageRequest(message=Message(message_id="m-" + (text or "data"), role=Role.ROLE_USER, parts=parts,
                                              context_id=context, task_id=task))


async def last_task(a2a: Any, request: Any) -> tuple[Any, list[Any]]:
    """The task as the stream (or the one answer) ends, and every item received."""
    items = [item async for item in a2a.send_message(request)]
    task = None
    for item in items:
        if item.HasField("task"):
            task = item.task
        elif item.HasField("status_update") and task is not None:
            task.status.CopyFrom(item.status_update.status)
    return task, items


def texts(message: Any) -> list[str]:
    return [part.text for part in message.parts if part.WhichOneof("content") == "text"]


@pytest.mark.parametrize("streaming,binding", [(False, "JSONRPC"), (True, "JSONRPC"), (False, "HTTP+JSON"),
                                               (True, "HTTP+JSON")])
def test_the_sdk_client_runs_a_tool_call_through_its_approval_and_a_second_turn(
        sealed: Sealed, tmp_path: Path, streaming: bool, binding: str) -> None:
    from a2a.client import A2ACardResolver
    from a2a.types import GetTaskRequest, TaskState
    from google.protobuf.json_format import MessageToDict

    sealed.script([*PAYING, {"content": "You paid 5 before."}])
    service = service_of(sealed, tmp_path)

    async def test(client: Client) -> None:
        card = await A2ACardResolver(client, BASE).get_agent_card()
        assert card.name == "cashier" and card.capabilities.streaming
        a2a = a2a_client(client, card, streaming=streaming, binding=binding)
        task, items = await last_task(a2a, user("Pay 5, please."))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task
        context, first = task.context_id, task.id
        assert first == f"{context}.1"
        asked = MessageToDict(task.status.message.parts[-1].data)
        assert asked["waiting_for"]["kind"] == "approval" and asked["waiting_for"]["tool"] == "pay"
        got = await a2a.get_task(GetTaskRequest(id=first))
        assert got.status.state == TaskState.TASK_STATE_INPUT_REQUIRED

        # The next message answers the wait: the same task completes with the model's answer.
        done, _ = await last_task(a2a, user(data={"approve": True}, context=context, task=first))
        assert done.id == first and done.status.state == TaskState.TASK_STATE_COMPLETED, done
        assert texts(done.status.message) == ["Paid 5."]
        # A second turn in the context: a new task, and the model is sent the first turn too.
        again, _ = await last_task(a2a, user("What did I pay?", context=context))
        assert again.id == f"{context}.2" and texts(again.status.message) == ["You paid 5 before."]
        sent = [m.get("content") for m in sealed.model.requests()[-1]["body"]["messages"]]
        assert sent[1] == "Pay 5, please." and sent[-1] == "What did I pay?"
        assert (await a2a.get_task(GetTaskRequest(id=first))).status.state == TaskState.TASK_STATE_COMPLETED
        if streaming:
            assert items[0].HasField("task") and any(i.HasField("status_update") for i in items)

    serve(service, test)


def test_the_card_is_signed_over_its_jcs_form_and_says_the_new_digest_once_swapped(sealed: Sealed,
                                                                                   tmp_path: Path) -> None:
    from a2a.client import A2ACardResolver
    from a2a.utils.signing import InvalidSignaturesError, create_signature_verifier

    from heddle.format.keys import load_public_key
    from heddle.format.trust import TrustPolicy
    from heddle.server.follow import open_edition

    public = load_public_key(sealed.key.public_path)
    asked: list[str | None] = []

    def key_of(kid: str | None, jku: str | None) -> Any:
        asked.append(kid)
        return public.key

    verify = create_signature_verifier(key_of, ["EdDSA"])
    service = service_of(sealed, tmp_path, card_key=sealed.key.private_path, public_url="https://agents.example.test")
    newer = seal_agent(tmp_path / "v2", sealed.model, key=sealed.key)

    async def test(client: Client) -> None:
        from a2a.client.card_resolver import parse_agent_card

        card = await A2ACardResolver(client, BASE).get_agent_card(signature_verifier=verify)
        assert asked == [public.keyid]
        assert [i.url for i in card.supported_interfaces] == ["https://agents.example.test/a2a"] * 2
        assert {i.protocol_binding for i in card.supported_interfaces} == {"JSONRPC", "HTTP+JSON"}
        shown = (await client.get("/.well-known/agent-card.json")).json()
        (extension,) = shown["capabilities"]["extensions"]
        assert extension["params"] == {"digest": service.sealed.digest, "signers": [public.keyid],
                                       "tools": dict(service.sealed.tool_fingerprints)}
        assert list(extension["params"]["tools"]) == ["pay"]
        before = extension["params"]["digest"]
        # A card changed after signing does not verify.
        shown["capabilities"]["extensions"][0]["params"]["digest"] = "sha256:" + "0" * 64
        with pytest.raises(InvalidSignaturesError):
            verify(parse_agent_card(shown))

        # A swap (as tag following makes it): the very next card says the new digest, signed.
        trust = TrustPolicy.from_names((sealed.key.public_path,), allow_unsigned=False)
        edition = await asyncio.to_thread(open_edition, service.config, trust, service, newer.path, "sha256:v2")
        service.swap(edition)
        card = await A2ACardResolver(client, BASE).get_agent_card(signature_verifier=verify)
        (extension,) = card.capabilities.extensions
        assert extension.params["digest"] == edition.sealed.digest != before

    serve(service, test)


async def rpc(client: Client, method: str, params: Any = None, **headers: str) -> dict[str, Any]:
    response = await client.post("/a2a", json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params or {}},
                                 headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def message(*parts: dict[str, Any], **fields: str) -> dict[str, Any]:
    return {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": list(parts), **fields}}


def test_every_refusal_is_an_error_of_the_binding_and_a_run_is_admitted_guarded_and_counted(
        sealed: Sealed, tmp_path: Path) -> None:
    from tests.server.support import metric

    sealed.script([{"content": "Hello."}])
    service = service_of(sealed, tmp_path, max_concurrent=1, auth_token="s3cret")
    token = {"Authorization": "Bearer s3cret"}

    async def test(client: Client) -> None:
        # The guard and authentication in front of /v1/runs are in front of A2A too.
        assert (await client.get("/.well-known/agent-card.json")).status_code == 401
        assert (await client.post("/a2a", json={})).status_code == 401
        assert (await client.post("/a2a", json={}, headers={**token, "Host": "evil.example"})).status_code == 421
        assert (await client.post("/a2a", json={}, headers={**token, "Origin": "https://evil.example"})
                ).status_code == 403
        assert (await client.post("/a2a", content=b"{}", headers={**token, "Content-Type": "text/plain"})
                ).status_code == 415
        client.headers.update(token)
        card = (await client.get("/.well-known/agent-card.json")).json()
        assert card["securitySchemes"] == {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}

        def error(answer: dict[str, Any]) -> tuple[int, str]:
            return answer["error"]["code"], answer["error"]["message"]

        # Bad input, by name.
        raw = await client.post("/a2a", content=b"{not json", headers={"Content-Type": "application/json"})
        assert raw.status_code == 200 and raw.json()["error"]["code"] == -32700
        batch = await client.post("/a2a", json=[{"jsonrpc": "2.0", "id": 1, "method": "GetTask"}])
        assert batch.json()["error"]["code"] == -32600 and "batches" in batch.json()["error"]["message"]
        assert error(await rpc(client, "Nope"))[0] == -32601
        code, text = error(await rpc(client, "SendMessage", message({"data": {"x": 1}})))
        assert code == -32602 and "send the user's message as a text part" in text
        code, text = error(await rpc(client, "SendMessage", message({"url": "https://x.example/f.pdf"})))
        assert code == -32005 and "not files" in text
        code, text = error(await rpc(client, "SendMessage", {**message({"text": "hi"}), "bogus": 1}))
        assert code == -32602 and "bogus" in text
        code, text = error(await rpc(client, "SendMessage", {**message({"text": "hi"}),
                                                             "configuration": {"returnImmediately": True}}))
        assert code == -32004 and "returnImmediately" in text
        assert error(await rpc(client, "CreateTaskPushNotificationConfig", {"taskId": "x"}))[0] == -32003
        assert error(await rpc(client, "SendMessage", message({"text": "hi"}), **{"A2A-Version": "0.3"}))[0] == -32009
        # Unknown tasks and conversations.
        code, text = error(await rpc(client, "GetTask", {"id": "nope.1"}))
        assert code == -32001 and "'nope.1'" in text
        code, text = error(await rpc(client, "SendMessage", message({"text": "hi"}, contextId="nope")))
        assert code == -32602 and "no such conversation" in text
        rest = await client.get("/a2a/tasks/nope.1")
        assert rest.status_code == 404 and rest.json()["error"]["status"] == "NOT_FOUND"
        rest = await client.post("/a2a/message:send", json=message({"data": {"x": 1}}))
        assert rest.status_code == 400 and rest.json()["error"]["details"][0]["reason"] == "INVALID_PARAMS"

        # Over capacity: the one slot is taken.
        ticket = service.admission.admit()
        code, text = error(await rpc(client, "SendMessage", message({"text": "hi"})))
        assert code == -32050 and "--max-concurrent 1" in text
        rest = await client.post("/a2a/message:stream", json=message({"text": "hi"}))
        assert rest.status_code == 429 and rest.headers["Retry-After"] == "1"
        assert rest.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
        ticket.release()
        # A run: admitted, counted, its slot released.
        answer = await rpc(client, "SendMessage", {**message({"text": "hi"}), "configuration": {"historyLength": 0}})
        assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", answer
        assert "history" not in answer["result"]["task"]
        assert service.admission.active == 0
        shown = service.metrics.render().decode()
        assert metric(shown, "heddle_runs_accepted_total") == 1
        assert metric(shown, "heddle_runs_rejected_total", 'reason="busy"') == 2
        # Draining: refused, as /v1/runs is.
        service.admission.start_draining()
        code, text = error(await rpc(client, "SendMessage", message({"text": "hi"})))
        assert code == -32051 and "shutting down" in text
        rest = await client.post("/a2a/message:send", json=message({"text": "hi"}))
        assert rest.status_code == 503 and rest.json()["error"]["status"] == "UNAVAILABLE"
        assert (await client.get("/v1/capabilities")).json()["serve"] == ["runs", "mcp", "a2a", "responses", "ag-ui"]

    serve(service, test)


def test_a_flow_takes_its_inputs_as_a_data_part_and_without_a_store_each_message_is_a_task(
        sealed: Sealed, tmp_path: Path) -> None:
    import heddle
    from heddle.format.trust import TrustPolicy
    from heddle.server.config import ServerConfig
    from heddle.server.served_bundle import open_served
    from heddle.server.service import Service
    from tests.server.flows import one_tool_flow, write_tools

    flow = one_tool_flow("echoer", "echo").write(tmp_path / "flow.json")
    started = tmp_path / "started"
    # With {"hold": true} the tool says it started and waits (never past a few seconds) for the drain to stop it.
    echo = (f"#!/bin/sh\nin=$(cat)\ncase \"$in\" in *hold*) touch {started}; i=0; "
            "while [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done;; esac\necho \"$in\"\n")
    bundle = heddle.seal(flow, tools_dir=write_tools(tmp_path / "tools", {"echo": echo}),
                         sign_key=sealed.key.private_path, output=tmp_path / "echoer.heddle").path
    config = ServerConfig(bundle=str(bundle), trust=(sealed.key.public_path,))
    trust = TrustPolicy.from_names((sealed.key.public_path,), allow_unsigned=False)
    service = Service(config, sealed=open_served(config, trust))

    async def test(client: Client) -> None:
        card = (await client.get("/.well-known/agent-card.json")).json()
        assert card["defaultInputModes"] == ["application/json"] and card["name"] == "echoer"
        answer = await rpc(client, "SendMessage", message({"data": {"x": 12345678901234567}}))
        task = answer["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", answer
        # The number as sent (a protobuf Value would have made it a double), and as the flow answered it.
        assert task["artifacts"][0]["parts"][0]["data"] == {"x": 12345678901234567.0}
        missing = await rpc(client, "GetTask", {"id": task["id"]})
        assert missing["error"]["code"] == -32001 and "--session-store" in missing["error"]["message"]
        refused = await rpc(client, "SendMessage", message({"text": "hi"}))
        assert refused["error"]["code"] == -32602 and "is a flow, not an agent" in refused["error"]["message"]
        later = await rpc(client, "SendMessage", message({"data": {"x": 1}}, contextId=task["contextId"]))
        assert later["error"]["code"] == -32602 and "keeps no conversations" in later["error"]["message"]

        # The drain's timeout cancels a task in flight: its sender is told, in the binding's shape.
        held = asyncio.ensure_future(rpc(client, "SendMessage", message({"data": {"x": "hold"}})))
        while not started.exists():
            assert not held.done(), held.result()
            await asyncio.sleep(0.01)
        service.admission.start_draining()
        assert service.admission.cancel_all() == 1
        cancelled = await held
        assert cancelled["error"]["code"] == -32051 and "shutting down" in cancelled["error"]["message"]
        assert cancelled["error"]["data"][0]["reason"] == "CANCELLED" and service.admission.active == 0

    serve(service, test)
