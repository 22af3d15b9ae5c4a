"""GeminiConfig with a Google AI Studio key, called through Gemini's OpenAI-compatible endpoint.

The reference runtime (WayFlow 26.3.1) calls Gemini with the config's model_id (`gemini/` names the
AI Studio API, and is not part of the model's name), the key of its GeminiAIStudioAuthConfig, else
$GEMINI_API_KEY, and the config's generation parameters; it reads no `url`, `api_key`,
`api_provider` or `api_type` of a GeminiConfig. Vertex AI auth needs Google Cloud credentials.
The vendor is never called: the scripted model stands in for it, its URL given for the run
(`--model-url NAME=URL`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import DocumentError
from heddle.graph import llm_configs
from heddle.model.endpoints import flow_endpoints
from heddle.settings import RunSettings
from heddle.agentspec import load_flow
from heddle.agentspec.components import GEMINI_OPENAI_URL
from tests.support.flows import prop
from tests.support.inproc import URL, run_outcome, served_model


def gemini(auth: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"component_type": "GeminiConfig", "id": "gem", "name": "gem", "model_id": "gemini/gemini-2.5-flash",
            "auth": auth if auth is not None else {"component_type": "GeminiAIStudioAuthConfig", "id": "studio",
                                                   "name": "studio", "api_key": "$GEMINI_TEST_KEY"},
            "default_generation_parameters": {"temperature": 0.2}, **extra}


def agent(llm: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"component_type": "Agent", "id": "helper", "name": "helper", "agentspec_version": "26.1.2",
            "inputs": [prop("user")], "llm_config": llm, "system_prompt": "You help {{user}}.", **extra}


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_an_agent_on_gemini_asks_the_openai_compatible_endpoint_with_its_ai_studio_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_TEST_KEY", "studio-key")
    monkeypatch.setenv("GEMINI_API_KEY", "not-this-one")
    doc = write(tmp_path / "agent.json", agent(gemini()))
    settings = RunSettings(model_urls=(f"gem={URL}",))
    with served_model([{"content": "Hello Ann."}]) as model:
        outcome = run_outcome(doc, None, {"user": "Ann"}, settings=settings, transport=model.transport,
                              message="hi")
        (request,) = model.requests()
    assert outcome.outputs == {"result": "Hello Ann."}
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer studio-key"
    body = request["body"]
    assert body["model"] == "gemini-2.5-flash"  # the AI Studio model's own name
    assert body["temperature"] == 0.2
    assert body["messages"] == [{"role": "system", "content": "You help Ann."}, {"role": "user", "content": "hi"}]


def test_without_a_key_in_its_auth_the_key_is_gemini_api_key_and_the_url_is_geminis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "from-env")
    flow = load_flow(write(tmp_path / "agent.json",
                           agent(gemini({"component_type": "GeminiAIStudioAuthConfig", "name": "studio"}))))
    (endpoint,) = flow_endpoints(list(llm_configs(flow)), {}).values()
    assert (endpoint.base_url, endpoint.model_id, endpoint.api_key) == (GEMINI_OPENAI_URL, "gemini-2.5-flash",
                                                                        "from-env")


def test_structured_outputs_go_as_response_format_as_the_reference_sends_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_TEST_KEY", "k")
    doc = write(tmp_path / "agent.json", agent(gemini(), human_in_the_loop=False,
                                               outputs=[prop("n", "integer"), prop("why")]))
    settings = RunSettings(model_urls=(f"gem={URL}",))
    with served_model([{"content": '{"n": 3, "why": "counted"}'}]) as model:
        outcome = run_outcome(doc, None, {"user": "Ann"}, settings=settings, transport=model.transport,
                              message="count")
        body = model.requests()[0]["body"]
    assert body["response_format"]["type"] == "json_schema"
    assert outcome.outputs is not None and outcome.outputs["n"] == 3


VERTEX = {"component_type": "GeminiVertexAIAuthConfig", "name": "vertex", "project_id": "p", "location": "global"}


@pytest.mark.parametrize(("llm", "said"), [
    (gemini(VERTEX), (r"\$\.llm_config\.auth: GeminiVertexAIAuthConfig 'vertex' cannot run in heddle: .*Google "
                      r"Cloud credentials.*GeminiAIStudioAuthConfig")),
    (gemini(url="https://example.test/v1"), r"GeminiConfig 'gem'.* url"),
    (gemini(api_key="$KEY"), r"GeminiConfig 'gem': api_key is not read .*give the key as its auth's api_key"),
    (gemini(api_type="responses"), r"GeminiConfig 'gem'.* api_type"),
    (gemini(api_provider="vertex"), r"GeminiConfig 'gem'.* api_provider"),
    ({**gemini(), "model_id": "vertex_ai/gemini-2.5-flash"}, r"names a Vertex AI model"),
    (gemini(provider="openai"), r"provider"),
])
def test_what_the_reference_reads_otherwise_is_refused_by_name(tmp_path: Path, llm: dict[str, Any],
                                                               said: str) -> None:
    with pytest.raises(DocumentError, match=said):
        load_flow(write(tmp_path / "agent.json", agent(llm)))


def test_a_request_to_the_server_may_not_use_its_gemini_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.server.model_policy import ModelPolicy, Refusal

    # auth.api_key: $VAR would read the server's environment, as api_key: $VAR would.
    flow = load_flow(write(tmp_path / "a.json", agent(gemini())))
    refused = [step for step in ModelPolicy().plan(flow) if isinstance(step, Refusal)]
    assert len(refused) == 1 and "'$GEMINI_TEST_KEY' would read this server's environment" in refused[0].message
    # Without a key, the reference's $GEMINI_API_KEY is the server's own: a request's run goes without it.
    monkeypatch.setenv("GEMINI_API_KEY", "server-secret")
    flow = load_flow(write(tmp_path / "b.json",
                           agent(gemini({"component_type": "GeminiAIStudioAuthConfig", "name": "studio"}))))
    endpoints = flow_endpoints(list(llm_configs(flow)), {})
    ModelPolicy().assign_keys(flow, endpoints, from_request=True)
    assert [e.api_key for e in endpoints.values()] == [None]


def test_a_bundle_never_carries_a_gemini_key_and_says_which_variables_it_reads() -> None:
    from heddle.bundle.flowenv import env_reads, literal_keys

    written = agent(gemini({"component_type": "GeminiAIStudioAuthConfig", "name": "studio", "api_key": "AIza-k"}))
    assert literal_keys(written) == ["llm_config 'studio' at $.llm_config.auth has a literal api_key"]
    assert [(r.name, r.required) for r in env_reads(agent(gemini()))] == [("GEMINI_TEST_KEY", True)]
    keyless = agent(gemini({"component_type": "GeminiAIStudioAuthConfig", "name": "studio"}))
    assert [(r.name, r.required) for r in env_reads(keyless)] == [("GEMINI_API_KEY", False)]


def test_a_document_older_than_gemini_is_refused(tmp_path: Path) -> None:
    # pyagentspec 26.3.1 refuses it: "the minimum allowed version is 26.1.2".
    with pytest.raises(DocumentError) as caught:
        load_flow(write(tmp_path / "agent.json", {**agent(gemini()), "agentspec_version": "25.4.1"}))
    assert "$.llm_config is a GeminiConfig, which Agent Spec 26.1.2 introduced" in str(caught.value)
