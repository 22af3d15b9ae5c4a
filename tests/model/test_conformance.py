"""Against the conformance runner's own scripted model (`../shared/conformance/run.py`).

Our scripted server must answer byte for byte as the runner's does, and our client must
read every conformance case's answers from the runner's server, streamed and buffered.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from heddle.errors import ModelError
from heddle.model.client import AssistantTurn, ModelClient, ModelEndpoint
from tests.support.scripted_model import scripted_model

# The shared corpus lives beside the checkout; scripts/test runs the corpus itself only when it is there.
CONFORMANCE = Path(os.environ.get("HEDDLE_CONFORMANCE_DIR")
                   or Path(__file__).resolve().parents[3] / "shared" / "conformance")
if not (CONFORMANCE / "run.py").is_file():
    pytest.skip(f"the conformance corpus is not at {CONFORMANCE} (set HEDDLE_CONFORMANCE_DIR)",
                allow_module_level=True)


def _runner() -> ModuleType:
    path = CONFORMANCE / "run.py"
    spec = importlib.util.spec_from_file_location("heddle_conformance_run", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


RUNNER = _runner()
CASES = sorted(d for d in (CONFORMANCE / "cases").iterdir() if (d / "case.json").exists())
SCRIPTS = {d.name: json.loads((d / "case.json").read_text(encoding="utf-8")).get("model") or [] for d in CASES}

# Answers the cases do not exercise but users' scripts will.
EXTRA = [
    {"content": "Grüße, 世界 — 🌍"},
    {"content": "both", "tool_calls": [{"name": "a", "arguments": {"x": "é" * 7}},
                                       {"name": "b", "arguments": {"nested": {"list": [1, None, True]}}}]},
    {"content": ""},
    {"content": "x"},
    {"tool_calls": [{"name": "empty", "arguments": {}}]},
]


def test_the_corpus_has_model_scripts() -> None:
    assert sum(1 for s in SCRIPTS.values() if s) >= 8


def test_our_server_answers_byte_for_byte_like_the_runners(tmp_path: Path) -> None:
    script = [entry for name in sorted(SCRIPTS) for entry in SCRIPTS[name]] + EXTRA
    # Alternate streamed and buffered, send one misrouted request, and run one past the end.
    plan: list[tuple[str, dict[str, Any]]] = [("/v1/chat/completions", {"stream": i % 2 == 0, "messages": []})
                                              for i in range(len(script))]
    plan.insert(3, ("/v1/completions", {"prompt": "x"}))
    plan += [("/v1/chat/completions", {"stream": True}), ("/v1/chat/completions", {})]

    def exchange(base: str) -> list[tuple[int, str, bytes]]:
        origin = base.removesuffix("/v1")
        with httpx.Client() as http:
            answers = []
            for path, body in plan:
                r = http.post(origin + path, json=body)
                answers.append((r.status_code, r.headers["content-type"], r.content))
            return answers

    with RUNNER.ScriptedModel(script) as theirs:
        expected = exchange(theirs.url)
        their_requests = theirs.requests
    with scripted_model(script, tmp_path) as ours:
        got = exchange(ours.url)
        our_requests = ours.requests()
    assert len(got) == len(expected)
    for i, (mine, reference) in enumerate(zip(got, expected)):
        assert mine == reference, f"answer {i} ({plan[i]}) differs"
    assert [(r["path"], r["body"]) for r in our_requests] == [(r["path"], r["body"]) for r in their_requests]


def _expected_turn(entry: dict[str, Any], index: int, stream: bool) -> AssistantTurn:
    from heddle.model.turn import ToolCall

    calls = [ToolCall(id=f"call_{index}_{i}", name=c["name"], arguments=json.dumps(c.get("arguments", {})))
             for i, c in enumerate(entry.get("tool_calls", []))]
    # Only buffered answers carry usage; the runner's streams do not.
    usage = None if stream else {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return AssistantTurn(content=entry.get("content") or None, tool_calls=calls,
                         finish_reason="tool_calls" if calls else "stop", usage=usage)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "buffered"])
def test_our_client_reads_every_case_from_the_runners_model(stream: bool) -> None:
    # One runner server takes every case's answers in turn (its ids number requests across them).
    labelled = [(name, entry) for name in sorted(SCRIPTS) for entry in SCRIPTS[name]]
    labelled += [("extra", entry) for entry in EXTRA]
    deltas: list[str] = []

    async def converse(url: str) -> tuple[list[AssistantTurn], ModelError]:
        endpoint = ModelEndpoint(base_url=url, model_id="scripted", api_key="sekret-123", params={"temperature": 0})
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        turns = []
        async with ModelClient(stream=stream, retries=0) as client:
            for _ in labelled:
                turn = await client.chat(endpoint, messages, on_delta=deltas.append)
                messages.append(turn.as_message())
                messages += [{"role": "tool", "tool_call_id": c.id, "content": "{}"} for c in turn.tool_calls]
                turns.append(turn)
            with pytest.raises(ModelError) as past_the_end:
                await client.chat(endpoint, messages)
        return turns, past_the_end.value

    with RUNNER.ScriptedModel([entry for _, entry in labelled]) as theirs:
        turns, error = asyncio.run(converse(theirs.url))
        requests = list(theirs.requests)
    for index, ((case, entry), turn) in enumerate(zip(labelled, turns, strict=True)):
        assert turn == _expected_turn(entry, index, stream), f"case {case}: answer {entry} read as {turn}"
    assert "".join(deltas) == "".join(entry.get("content", "") for _, entry in labelled)
    assert "HTTP 500" in str(error) and "the script has no more responses" in str(error)
    assert len(requests) == len(labelled) + 1
    for request in requests:
        assert bool(request["body"]["stream"]) is stream
        assert request["headers"]["authorization"] == "Bearer sekret-123"
        assert request["body"]["model"] == "scripted" and request["body"]["temperature"] == 0
    # Each request carries the conversation so far; the runner finds every tool result in it.
    last = requests[-1]["body"]
    assert len(RUNNER.tool_results(last)) == sum(len(entry.get("tool_calls", [])) for _, entry in labelled)
