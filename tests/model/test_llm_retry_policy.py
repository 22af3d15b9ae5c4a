"""An llm config's `retry_policy`, as WayFlow 26.3.1 applies it to a model's requests: its attempts
replace heddle's own retries (never added to them), the statuses it deems recoverable are asked
again and no others, a request that outlasts its `request_timeout` is asked again, and a TLS failure
is not. Against a vendor stand-in that fails on cue; backoffs are tiny in the documents, and the
tests count attempts, never seconds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import ModelError, ModelOverrun
from heddle.model.client import AssistantTurn, ModelClient, ModelEndpoint
from heddle.agentspec.components import RetryPolicy
from tests.model.vendor import ANSWER, Vendor
from tests.support.inproc import run_doc

FAST = {"initial_retry_delay": 0.001, "max_retry_delay": 0.002, "backoff_factor": 1.0}


def ask(url: str, policy: dict[str, Any] | None, *, retries: int = 3, stream: bool = True) -> AssistantTurn:
    endpoint = ModelEndpoint(base_url=url, model_id="vendor-model", api_key="k",
                             retry_policy=None if policy is None else RetryPolicy.model_validate(policy))

    async def go() -> AssistantTurn:
        async with ModelClient(stream=stream, retries=retries, backoff=0.001) as client:
            return await client.chat(endpoint, [{"role": "user", "content": "hi"}])

    return asyncio.run(go())


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "buffered"])
def test_the_policy_s_attempts_replace_heddle_s_retries(stream: bool) -> None:
    # heddle's own rule would ask four times; the document's max_attempts 1 asks twice, and no more.
    with Vendor([500, 500, 500]) as vendor, pytest.raises(ModelError) as info:
        ask(vendor.url, {"max_attempts": 1, **FAST}, retries=3, stream=stream)
    assert len(vendor.attempts) == 2 and "HTTP 500 after 2 attempts" in str(info.value)
    # and more than heddle's own when the document says so
    with Vendor([500, 429, 503, 502]) as vendor:
        assert ask(vendor.url, {"max_attempts": 4, **FAST}, retries=0, stream=stream).content == ANSWER
    assert len(vendor.attempts) == 5


def test_max_attempts_zero_asks_once() -> None:
    with Vendor([503]) as vendor, pytest.raises(ModelError):
        ask(vendor.url, {"max_attempts": 0, **FAST})
    assert len(vendor.attempts) == 1


@pytest.mark.parametrize(("plan", "policy", "attempts", "answered"), [
    ([409], {}, 2, True),  # recoverable by the specification's default, never by heddle's own rule
    ([500], {"service_error_retry_on_any_5xx": False}, 1, False),
    ([501], {}, 1, False),  # never, whatever the policy says
    ([400], {"recoverable_statuses": {"400": []}}, 1, False),
    ([418], {"recoverable_statuses": {"418": []}}, 2, True),
    ([418], {"recoverable_statuses": {"418": ["teapot_busy"]}}, 1, False),  # the code is not in the answer
    ([429], {"recoverable_statuses": {}}, 1, False),
])
def test_which_statuses_are_asked_again(plan: list[int | str], policy: dict[str, Any], attempts: int,
                                        answered: bool) -> None:
    with Vendor(plan) as vendor:
        try:
            turn = ask(vendor.url, {**FAST, **policy})
        except ModelError:
            turn = None
    assert len(vendor.attempts) == attempts
    assert (turn is not None and turn.content == ANSWER) == answered


def test_a_service_code_in_the_answer_makes_a_status_recoverable() -> None:
    body = json.dumps({"error": {"code": "TeapotBusy", "message": "later"}})
    with Vendor([418], error_body=body) as vendor:
        assert ask(vendor.url, {**FAST, "recoverable_statuses": {"418": ["teapotbusy"]}}).content == ANSWER
    assert len(vendor.attempts) == 2


def test_a_request_past_its_request_timeout_is_asked_again() -> None:
    # Without a policy heddle's --model-timeout applies and a silent server is not asked again.
    with Vendor(["hang", "hang"]) as vendor:
        assert ask(vendor.url, {"max_attempts": 2, "request_timeout": 0.2, **FAST}).content == ANSWER
    assert len(vendor.attempts) == 3

    async def silent(url: str) -> None:
        endpoint = ModelEndpoint(base_url=url, model_id="m", api_key=None)
        async with ModelClient(timeout=0.2) as client:
            await client.chat(endpoint, [{"role": "user", "content": "hi"}])

    with Vendor(["hang"]) as vendor, pytest.raises(ModelOverrun):
        asyncio.run(silent(vendor.url))
    assert len(vendor.attempts) == 1


def test_a_document_s_policy_reaches_the_model_requests(tmp_path: Path) -> None:
    with Vendor([500, 429]) as vendor:
        doc = tmp_path / "agent.json"
        config = {"component_type": "OpenAiCompatibleConfig", "id": "m", "name": "m", "model_id": "vendor-model",
                  "url": vendor.url, "retry_policy": {"max_attempts": 2, "request_timeout": 5, **FAST}}
        doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.2", "id": "a",
                                   "name": "a", "llm_config": config, "system_prompt": "You help."}))
        state = run_doc(doc, message="hi")
    assert len(vendor.attempts) == 3 and ANSWER in json.dumps(state)
    with Vendor([500, 500]) as vendor:
        doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.2", "id": "a",
                                   "name": "a", "system_prompt": "You help.",
                                   "llm_config": {**config, "url": vendor.url,
                                                  "retry_policy": {"max_attempts": 1, **FAST}}}))
        with pytest.raises(ModelError):
            run_doc(doc, message="hi")
    assert len(vendor.attempts) == 2
