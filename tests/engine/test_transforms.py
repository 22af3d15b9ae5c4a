"""An Agent's MessageSummarizationTransform and ConversationSummarizationTransform, as the reference
runtime (WayFlow 26.3.1) applies them, in-process (the scripted model over ASGITransport).

The reference, read from its source and run on these conversations:
- before each request the agent's messages after the system prompt go through its transforms; the
  model is sent the result, the conversation kept is unchanged;
- a summary is asked in one user message of text parts: "{instructions}\\n\\nPrevious summary:\\n
  Nothing summarized yet\\n\\nAdded content:\\n", then the content (for a conversation, each message
  as "\\n\\n\\n{role}:\\n\\n" and its text, a tool result as the assistant's, the cached summary
  without a role), and fills the template ("Summarized message: {{summary}}");
- MessageSummarizationTransform goes from the last message back, and replaces a text or tool result
  over max_message_size characters (counted as tokens, characters / 4 rounded up) by its summary,
  cached by its place in the conversation: a message is summarised once, unless `datastore: null`;
- ConversationSummarizationTransform, past max_num_messages, sends one user message with the summary
  of all but the min_num_messages latest, and caches (prefix size, summary) for the conversation: the
  first summary stored is the one found next time, so the summary after it is made from it again.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import DocumentError
from heddle.agentspec import load_flow
from tests.engine.test_sessions import step
from tests.support.flows import llm_config, server_tool, write_tool
from tests.support.inproc import URL, run_outcome, served_model
from tests.support.memstore import MemStore

MESSAGE_INSTRUCTIONS = (
    "Please make a summary of this message. Include relevant information and keep it short. "
    "Your response will replace the message, so just output the summary directly, no introduction needed.")
CONVERSATION_INSTRUCTIONS = (
    "Please make a summary of this conversation. Include relevant information and keep it short. "
    "Your response will replace the messages, so just output the summary directly, no introduction needed.")


def prompt(instructions: str, previous: str = "Nothing summarized yet") -> str:
    return f"{instructions}\n\nPrevious summary:\n{previous}\n\nAdded content:\n"


def asked(*parts: str) -> list[dict[str, Any]]:
    """The messages of a summary request: one user message of text parts."""
    return [{"role": "user", "content": [{"type": "text", "text": part} for part in parts]}]


def summarizer() -> dict[str, Any]:
    return llm_config(URL, name="summarizer", model_id="small")


def agent(transforms: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"component_type": "Agent", "agentspec_version": "26.1.2", "id": "clerk", "name": "clerk",
            "llm_config": llm_config(URL, name="brain"), "system_prompt": "You file.", "transforms": transforms,
            **extra}


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def long_tool(tmp_path: Path) -> Path:
    tools = tmp_path / "tools"
    write_tool(tools, "fetch", "out = {'text': 'r' * 80}")
    return tools


FETCH = server_tool("fetch", [], ["text"])
CALL = {"tool_calls": [{"name": "fetch", "arguments": {}}]}


@pytest.mark.parametrize("cached", [True, False])
def test_a_long_message_and_a_long_tool_result_are_sent_as_their_summaries(tmp_path: Path, cached: bool) -> None:
    transform = {"component_type": "MessageSummarizationTransform", "name": "shorten", "llm": summarizer(),
                 "max_message_size": 40, **({} if cached else {"datastore": None})}
    doc = write(tmp_path / "agent.json", agent([transform], tools=[FETCH]))
    question = "q" * 41  # 11 tokens, over the 10 of 40 characters
    script = [{"content": "M1"}, CALL, {"content": "M2"}, *([] if cached else [{"content": "M3"}]), {"content": "ok"}]
    with served_model(script) as model:
        outcome = run_outcome(doc, long_tool(tmp_path), message=question, transport=model.transport)
        requests = model.requests()
    assert outcome.outputs == {"result": "ok"}
    bodies = [r["body"] for r in requests]
    result = bodies[-1]["messages"][3]  # the tool result as the agent's model was sent it
    assert [b["model"] for b in bodies] == (["small", "scripted", "small", "scripted"] if cached else
                                            ["small", "scripted", "small", "small", "scripted"])
    assert bodies[0]["messages"] == asked(prompt(MESSAGE_INSTRUCTIONS), question)
    assert bodies[0].get("tools") is None
    assert bodies[1]["messages"] == [{"role": "system", "content": "You file."},
                                     {"role": "user", "content": "Summarized message: M1"}]
    # The last message first: the tool's result, then (without a cache) the question again.
    assert bodies[2]["messages"] == asked(prompt(MESSAGE_INSTRUCTIONS), json.dumps({"text": "r" * 80},
                                                                              separators=(",", ":")))
    if not cached:
        assert bodies[3]["messages"] == asked(prompt(MESSAGE_INSTRUCTIONS), question)
    last = bodies[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool"]
    assert last[1]["content"] == ("Summarized message: M1" if cached else "Summarized message: M3")
    assert result["content"] == "Summarized message: M2" and result["tool_call_id"] == last[2]["tool_calls"][0]["id"]


def test_a_long_conversation_is_sent_as_a_summary_and_its_latest_messages(tmp_path: Path) -> None:
    transform = {"component_type": "ConversationSummarizationTransform", "name": "compact", "llm": summarizer(),
                 "max_num_messages": 3, "min_num_messages": 2}
    doc = write(tmp_path / "agent.json", agent([transform], tools=[FETCH]))
    script = [CALL, CALL, {"content": "S1"}, {"content": "done"}]
    with served_model(script) as model:
        outcome = run_outcome(doc, long_tool(tmp_path), message="go", transport=model.transport)
        bodies = [r["body"] for r in model.requests()]
    assert outcome.outputs == {"result": "done"}
    # Rounds 1 and 2 hold 1 and 3 messages: within max_num_messages, sent whole.
    assert len(bodies[0]["messages"]) == 2 and len(bodies[1]["messages"]) == 4
    whole = bodies[1]["messages"]  # system, user, the first call, its result
    second_call, second_result = [{k: v for k, v in m.items()} for m in bodies[3]["messages"][2:]]
    # Round 3 holds 5: the older 3 summarised, the latest 2 (the second call and its result) kept.
    assert bodies[2]["model"] == "small"
    assert bodies[2]["messages"] == asked(prompt(CONVERSATION_INSTRUCTIONS), "\n\n\nuser:\n\n", "go",
                                          "\n\n\nassistant:\n\n", "\n\n\nassistant:\n\n", whole[3]["content"])
    assert bodies[3]["messages"] == [{"role": "system", "content": "You file."},
                                     {"role": "user", "content": "Summarized conversation: S1"},
                                     second_call, second_result]
    assert second_call["role"] == "assistant" and second_result["role"] == "tool"


def test_in_a_session_the_summary_cached_for_the_conversation_is_used_on_later_turns(tmp_path: Path) -> None:
    transform = {"component_type": "ConversationSummarizationTransform", "name": "compact", "llm": summarizer(),
                 "max_num_messages": 3, "min_num_messages": 2}
    doc = write(tmp_path / "agent.json", agent([transform]))
    store = MemStore()
    for n in (1, 2):
        step(doc, store, message=f"u{n}", script=[{"content": f"a{n}"}])
    third = step(doc, store, message="u3", script=[{"content": "S1"}, {"content": "a3"}])
    assert third.requests[0]["body"]["messages"] == asked(prompt(CONVERSATION_INSTRUCTIONS), "\n\n\nuser:\n\n", "u1",
                                                          "\n\n\nassistant:\n\n", "a1", "\n\n\nuser:\n\n", "u2")
    assert third.requests[1]["body"]["messages"][1:] == [
        {"role": "user", "content": "Summarized conversation: S1"}, {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"}]
    # Turn 4: the cached summary stands for the first 3 messages; the summary of it and the 2 after
    # it takes their place.
    fourth = step(doc, store, message="u4", script=[{"content": "S2"}, {"content": "a4"}])
    assert fourth.requests[0]["body"]["messages"] == asked(
        prompt(CONVERSATION_INSTRUCTIONS), "Summarized conversation: S1", "\n\n\nassistant:\n\n", "a2",
        "\n\n\nuser:\n\n", "u3")
    assert fourth.requests[1]["body"]["messages"][1:] == [
        {"role": "user", "content": "Summarized conversation: S2"}, {"role": "assistant", "content": "a3"},
        {"role": "user", "content": "u4"}]
    # Turn 5: the first summary stored is still the one found (the reference's datastore keeps both).
    fifth = step(doc, store, message="u5", script=[{"content": "S3"}, {"content": "a5"}])
    assert fifth.requests[0]["body"]["messages"] == asked(
        prompt(CONVERSATION_INSTRUCTIONS), "Summarized conversation: S1", "\n\n\nassistant:\n\n", "a2",
        "\n\n\nuser:\n\n", "u3", "\n\n\nassistant:\n\n", "a3", "\n\n\nuser:\n\n", "u4")
    assert fifth.outcome.outputs == {"result": "a5"}


def test_the_summaries_are_chunked_and_carried_from_one_chunk_to_the_next() -> None:
    from heddle.engine.transforms import summarize
    from heddle.agentspec.components import MessageSummarizationTransform

    transform = MessageSummarizationTransform.model_validate(
        {"name": "t", "llm": summarizer(), "max_message_size": 8, "summarized_message_template": "[{{ summary }}]\n"})
    sent: list[list[str]] = []

    async def ask(llm: Any, parts: list[str]) -> str:
        sent.append(parts)
        return f"S{len(sent)}"

    # 2 tokens a chunk: "abcd" (1) and "efgh" (1) fit, "ijklmnop" (2) starts the next.
    summary = asyncio.run(summarize(ask, transform, ["abcd", "efgh", "ijklmnop"], 2))
    assert sent == [[prompt(MESSAGE_INSTRUCTIONS), "abcd", "efgh"], [prompt(MESSAGE_INSTRUCTIONS, "S1"), "ijklmnop"]]
    assert summary == "[S2]"  # Jinja drops the template's one trailing newline


def conversation(**fields: Any) -> dict[str, Any]:
    return {"component_type": "ConversationSummarizationTransform", "name": "compact", "llm": summarizer(), **fields}


SCHEMA = {"summarized_messages_cache": {"title": "cache", "type": "object", "properties": {
    "cache_key": {"type": "string"}, "cache_content": {"type": "string"}, "created_at": {"type": "number"},
    "last_used_at": {"type": "number"}}}}


@pytest.mark.parametrize(("transform", "said"), [
    (conversation(max_num_characters=500), r"give one of max_num_messages and max_num_characters"),
    (conversation(max_num_messages=None), r"give one of max_num_messages and max_num_characters"),
    (conversation(max_num_messages=10, min_num_messages=10), r"must be greater than min_num_messages"),
    (conversation(summarized_conversation_template="{% if summary %}{{summary}}{% endif %}"),
     r"only the \{\{summary\}\} placeholder"),
    (conversation(datastore={"component_type": "OracleDatabaseDatastore", "name": "db"}),
     r"\$\.transforms\[0\]\.datastore: OracleDatabaseDatastore 'db' cannot run in heddle"),
    (conversation(datastore={"component_type": "InMemoryCollectionDatastore", "name": "mem",
                             "datastore_schema": SCHEMA}),
     r"no collection 'summarized_conversations_cache'"),
    ({"component_type": "MessageSummarizationTransform", "name": "m", "llm": summarizer(), "max_message_size": 0},
     r"max_message_size"),
])
def test_what_the_specification_or_the_reference_refuses_is_refused_by_name(tmp_path: Path, transform: dict[str, Any],
                                                                           said: str) -> None:
    with pytest.raises(DocumentError, match=said):
        load_flow(write(tmp_path / "agent.json", agent([transform])))


def test_a_written_in_memory_datastore_with_the_cache_collection_runs(tmp_path: Path) -> None:
    transform = {"component_type": "MessageSummarizationTransform", "name": "m", "llm": summarizer(),
                 "datastore": {"component_type": "InMemoryCollectionDatastore", "name": "mem",
                               "datastore_schema": SCHEMA}}
    flow = load_flow(write(tmp_path / "agent.json", agent([transform])))
    assert flow is not None


# An Agent on Gemini with both transforms (their default in-memory datastores written out), exactly
# as pyagentspec 26.3.1 serialises it; its AI Studio key is a reference the components file fills.
EXPORT = (
    '{"component_type": "Agent", "id": "a", "name": "a", "description": null, "metadata": {}, "inputs": ['
    '], "outputs": [], "llm_config": {"$component_ref": "gem"}, "system_prompt": "hi", "tools": [], "tool'
    'boxes": [], "human_in_the_loop": true, "transforms": [{"component_type": "MessageSummarizationTransf'
    'orm", "id": "m", "name": "m", "description": null, "metadata": {}, "llm": {"$component_ref": "gem"},'
    ' "max_message_size": 40, "summarization_instructions": "Please make a summary of this message. Inclu'
    'de relevant information and keep it short. Your response will replace the message, so just output th'
    'e summary directly, no introduction needed.", "summarized_message_template": "Summarized message: {{'
    'summary}}", "max_cache_size": 10000, "max_cache_lifetime": 14400, "cache_collection_name": "summariz'
    'ed_messages_cache", "datastore": {"component_type": "InMemoryCollectionDatastore", "id": "8a338c57-9'
    '39b-4925-abfe-9bf04b1623be", "name": "default-inmemory-datastore", "description": null, "metadata": '
    '{}, "datastore_schema": {"summarized_messages_cache": {"properties": {"cache_key": {"type": "string"'
    '}, "cache_content": {"type": "string"}, "created_at": {"type": "number"}, "last_used_at": {"type": "'
    'number"}}, "type": "object"}}}}, {"component_type": "ConversationSummarizationTransform", "id": "c",'
    ' "name": "c", "description": null, "metadata": {}, "llm": {"$component_ref": "gem"}, "max_num_messag'
    'es": 3, "max_num_characters": null, "min_num_messages": 2, "summarization_instructions": "Please mak'
    'e a summary of this conversation. Include relevant information and keep it short. Your response will'
    ' replace the messages, so just output the summary directly, no introduction needed.", "summarized_co'
    'nversation_template": "Summarized conversation: {{summary}}", "max_cache_size": 10000, "max_cache_li'
    'fetime": 14400, "cache_collection_name": "summarized_conversations_cache", "datastore": {"component_'
    'type": "InMemoryCollectionDatastore", "id": "5062f99b-d4a6-4a4f-9eb7-90971627a433", "name": "default'
    '-inmemory-datastore", "description": null, "metadata": {}, "datastore_schema": {"summarized_conversa'
    'tions_cache": {"properties": {"cache_key": {"type": "string"}, "cache_content": {"type": "string"}, '
    '"prefix_size": {"type": "integer"}, "created_at": {"type": "number"}, "last_used_at": {"type": "numb'
    'er"}}, "type": "object"}}}}], "$referenced_components": {"gem": {"component_type": "GeminiConfig", "'
    'id": "gem", "name": "gem", "description": null, "metadata": {}, "model_id": "gemini-2.5-flash", "api'
    '_provider": null, "api_type": null, "api_key": null, "default_generation_parameters": null, "retry_p'
    'olicy": null, "auth": {"component_type": "GeminiAIStudioAuthConfig", "id": "studio", "name": "studio'
    '", "description": null, "metadata": {}, "api_key": {"$component_ref": "studio.api_key"}}}}, "agentsp'
    'ec_version": "26.1.2"}'
)


def test_a_pyagentspec_export_with_both_transforms_runs_them_in_order(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.settings import RunSettings

    monkeypatch.setenv("GEMINI_TEST_KEY", "studio-key")
    doc = tmp_path / "agent.json"
    doc.write_text(EXPORT, encoding="utf-8")
    components = write(tmp_path / "components.json",
                       {"$referenced_components": {"studio.api_key": "$GEMINI_TEST_KEY"}})
    with served_model([{"content": "M1"}, {"content": "ok"}]) as model:
        outcome = run_outcome(doc, None, message="q" * 41, transport=model.transport, components=components,
                              settings=RunSettings(model_urls=(f"gem={URL}",)))
        requests = model.requests()
    assert outcome.outputs == {"result": "ok"}
    # The message transform first (the question is over max_message_size 40), then the conversation
    # transform, which leaves one message (within max_num_messages 3) as it is.
    assert [r["body"]["model"] for r in requests] == ["gemini-2.5-flash", "gemini-2.5-flash"]
    assert requests[0]["headers"]["authorization"] == "Bearer studio-key"
    assert requests[0]["body"]["messages"] == asked(prompt(MESSAGE_INSTRUCTIONS), "q" * 41)
    assert requests[1]["body"]["messages"] == [{"role": "system", "content": "hi"},
                                               {"role": "user", "content": "Summarized message: M1"}]


def test_characters_are_counted_as_the_reference_counts_them() -> None:
    from heddle.engine.transforms import _characters

    # The reference counts 73 for these messages: each role, each text, each call's name and its
    # arguments as json.dumps writes them, each tool result (as the assistant's).
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":1,"é":"ü"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"y": 2}'},
                {"role": "assistant", "content": "done"}]
    assert _characters(messages) == 73


def test_past_max_num_characters_the_conversation_is_summarised(tmp_path: Path) -> None:
    transform = conversation(max_num_messages=None, max_num_characters=20, min_num_messages=1)
    doc = write(tmp_path / "agent.json", agent([transform]))
    # "user" and 17 characters are 21, over 20; with the one message kept there is nothing older, and
    # the reference (run on this conversation) asks no model and sends the summary of nothing.
    with served_model([{"content": "ok"}]) as model:
        run_outcome(doc, None, message="x" * 17, transport=model.transport)
        bodies = [r["body"] for r in model.requests()]
    assert len(bodies) == 1 and bodies[0]["messages"][1:] == [
        {"role": "user", "content": "Summarized conversation: Nothing summarized yet"},
        {"role": "user", "content": "x" * 17}]


def test_a_run_resumed_after_a_wait_decides_as_it_did_and_asks_no_summary_again(tmp_path: Path) -> None:
    from tests.engine.test_sessions import logging_tool, ran

    tools, log = tmp_path / "tools", tmp_path / "log"
    logging_tool(tools, "stamp", log, "{'stamped': 'yes'}")
    transform = {"component_type": "MessageSummarizationTransform", "name": "shorten", "llm": summarizer(),
                 "max_message_size": 40}
    doc = write(tmp_path / "agent.json", agent([transform], tools=[
        {**server_tool("stamp", ["text"], ["stamped"]), "requires_confirmation": True}]))
    store = MemStore()
    call = {"tool_calls": [{"name": "stamp", "arguments": {"text": "form"}}]}
    first = step(doc, store, tools=tools, message="q" * 41, script=[{"content": "M1"}, call])
    assert first.outcome.waiting is not None and len(first.requests) == 2
    second = step(doc, store, tools=tools, answer={"approve": True}, script=[{"content": "Stamped."}])
    # The summary and the first round come from the journal; the one request is the agent's next
    # round, with the question's summary from the cache.
    assert second.outcome.outputs == {"result": "Stamped."} and ran(log) == ["stamp"]
    (request,) = second.requests
    assert request["body"]["model"] == "scripted"
    assert request["body"]["messages"][1] == {"role": "user", "content": "Summarized message: M1"}


def test_transforms_on_an_agent_of_a_group_are_refused(tmp_path: Path) -> None:
    transform = {"component_type": "MessageSummarizationTransform", "name": "m", "llm": summarizer()}
    member = agent([transform])
    worker = {**agent([]), "id": "w", "name": "w"}
    group = {"component_type": "ManagerWorkers", "agentspec_version": "26.1.2", "name": "team",
             "group_manager": member, "workers": [worker]}
    with pytest.raises(DocumentError, match=r"the agent at group_manager has transforms"):
        load_flow(write(tmp_path / "team.json", group))


def test_the_cache_expires_and_evicts_as_the_reference_datastore_does() -> None:
    from heddle.engine.transforms import Cache
    from heddle.agentspec.components import MessageSummarizationTransform

    transform = MessageSummarizationTransform.model_validate(
        {"name": "t", "llm": summarizer(), "max_cache_size": 2, "max_cache_lifetime": 100})
    cache = Cache(transform, [])
    for n, key in enumerate(("a", "b", "c")):
        cache.store(key, {"cache_content": key.upper()}, now=float(n))
    # The reference evicts only once it holds more than max_cache_size: three rows are kept.
    assert [r["cache_key"] for r in cache.rows] == ["a", "b", "c"]
    assert cache.retrieve("a", now=10.0) == {"cache_key": "a", "cache_content": "A", "created_at": 0.0,
                                             "last_used_at": 0.0}
    cache.store("d", {"cache_content": "D"}, now=11.0)  # over the size: the least recently used ("b") goes
    assert [r["cache_key"] for r in cache.rows] == ["a", "c", "d"]
    # max_cache_lifetime counts from when a row was stored, however recently it was used.
    assert cache.retrieve("a", now=100.5) is None and cache.retrieve("c", now=100.5) is not None
    assert [r["cache_key"] for r in cache.rows] == ["c", "d"]
