"""An Agent's message transforms, applied as the reference runtime (WayFlow 26.3.1) applies them.

Before each request to the agent's model, its conversation (every message after the system prompt)
passes through its transforms in order; the model is sent what comes out, while the conversation
the agent keeps is unchanged. Messages are chat-completions messages; as the reference sees them,
a `tool` message is the assistant's, with no text of its own and its content as the tool's result.

- MessageSummarizationTransform: from the last message to the first, a text or a tool result whose
  estimated tokens (characters / 4, rounded up) exceed those of `max_message_size` characters is
  replaced by its summary.
- ConversationSummarizationTransform: a conversation of more than `max_num_messages` messages (or
  `max_num_characters`) is sent as one user message, the summary of its older part, followed by
  its `min_num_messages` latest messages (more when one of them answers a tool call made earlier,
  so that a call and its result stay together). The summary cached for the conversation stands
  for the messages it summarised: the first one stored is the one found, as in the reference's
  datastore, until it expires or is evicted.

A summary is asked of the transform's own model in one user message: the instructions and the
summary so far, then the content, in chunks of about 5,000 tokens (20,000 characters for a
conversation, `max_message_size` for a message), each chunk's summary carried into the next. The
last one fills the transform's template.

Summaries are cached as the reference caches them in an in-memory datastore (or a Postgres table:
heddle.engine.pgcache): entries expire
`max_cache_lifetime` seconds after they are stored; past `max_cache_size` entries the least
recently used key goes. A top-level agent's cache lasts its session (kept with its conversation),
another's one run of its node. In a session the clock a cache reads is journaled, so that a run
resumed later decides as it did the first time.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec.templates import render
from heddle.engine.pgcache import CONVERSATION, PostgresCache
from heddle.engine.seams import ModelRequest
from heddle.safeparse import loads_json

if TYPE_CHECKING:
    from heddle.engine.context import RunContext

Message = dict[str, Any]
Ask = Callable[[c.LlmConfig, list[str]], Awaitable[str]]

NOTHING_YET = "Nothing summarized yet"
PROMPT = "{instructions}\n\nPrevious summary:\n{previous}\n\nAdded content:\n"


def tokens(chars: int) -> int:
    """The reference's estimate of the tokens in `chars` characters."""
    return (chars + 3) // 4


CHUNK_TOKENS = tokens(20_000)  # of a conversation's summary request


class Cache:
    """One transform's cache: the rows of its datastore collection, in the order they were stored."""

    def __init__(self, transform: c.MessageSummarizationTransform | c.ConversationSummarizationTransform,
                 rows: list[dict[str, Any]]) -> None:
        self.max_size = transform.max_cache_size
        self.max_lifetime = transform.max_cache_lifetime
        self.rows = rows

    def _expire(self, now: float) -> None:
        if self.max_lifetime is not None:
            self.rows[:] = [row for row in self.rows if not now - row["created_at"] > self.max_lifetime]

    def retrieve(self, key: str, now: float) -> dict[str, Any] | None:
        self._expire(now)
        found = [row for row in self.rows if row["cache_key"] == key]
        if not found:
            return None
        content = dict(found[0])
        for row in found:
            row["last_used_at"] = now
        return content

    def store(self, key: str, content: dict[str, Any], now: float) -> None:
        if self.max_size and len(self.rows) > self.max_size:
            oldest = min(self.rows, key=lambda row: row.get("last_used_at", 0))["cache_key"]
            self.rows[:] = [row for row in self.rows if row["cache_key"] != oldest]
        self._expire(now)
        self.rows.append({"cache_key": key, **content, "created_at": now, "last_used_at": now})

    async def aretrieve(self, key: str, now: float) -> dict[str, Any] | None:
        return self.retrieve(key, now)

    async def astore(self, key: str, content: dict[str, Any], now: float) -> None:
        self.store(key, content, now)


# --------------------------------------------------------------------------- messages as the reference sees them


def _role(message: Message) -> str:
    return "assistant" if message.get("role") == "tool" else str(message.get("role"))


def _text(message: Message) -> str:
    content = message.get("content")
    if message.get("role") == "tool" or not isinstance(content, str):
        return ""
    return content


def _result(message: Message) -> str | None:
    content = message.get("content")
    return (content if isinstance(content, str) else "") if message.get("role") == "tool" else None


def _arguments(text: Any) -> str:
    try:
        return json.dumps(loads_json(text))
    except (TypeError, ValueError):
        return str(text)


def _characters(messages: list[Message]) -> int:
    count = 0
    for message in messages:
        count += len(_role(message)) + len(_text(message))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            count += len(str(function.get("name", ""))) + len(_arguments(function.get("arguments", "{}")))
        result = _result(message)
        if result is not None:
            count += len(result)
    return count


def _fill(template: str, summary: str) -> str:
    # Jinja's reading of the template: newlines as \n, and one trailing newline dropped.
    text = template.replace("\r\n", "\n").replace("\r", "\n")
    return render(text.removesuffix("\n"), {"summary": summary})


async def summarize(ask: Ask, transform: c.MessageSummarizationTransform | c.ConversationSummarizationTransform,
                    contents: list[str], max_tokens: int) -> str:
    chunk: list[str] = []
    in_chunk, summary = 0, NOTHING_YET
    for content in contents:
        in_chunk += tokens(len(content))
        if in_chunk > max_tokens and chunk:
            summary = await ask(transform.llm, [_prompt(transform, summary), *chunk])
            chunk, in_chunk = [], 0
        chunk.append(content)
    if chunk:
        summary = await ask(transform.llm, [_prompt(transform, summary), *chunk])
    return _fill(transform.template(), summary)


def _prompt(transform: c.MessageSummarizationTransform | c.ConversationSummarizationTransform, previous: str) -> str:
    return PROMPT.format(instructions=transform.summarization_instructions, previous=previous)


# --------------------------------------------------------------------------- the two transforms


async def _summarize_messages(transform: c.MessageSummarizationTransform, messages: list[Message], ask: Ask,
                              cache: Cache | PostgresCache | None, now: float) -> list[Message]:
    limit = tokens(transform.max_message_size)

    async def summarized(text: str, key: str) -> str:
        found = await cache.aretrieve(key, now) if cache is not None else None
        if found:
            return str(found["cache_content"])
        summary = await summarize(ask, transform, [text], limit)
        if cache is not None:
            await cache.astore(key, {"cache_content": summary}, now)
        return summary

    out: list[Message] = []
    # From the last message back, as the reference goes.
    for index in range(len(messages) - 1, -1, -1):
        message = dict(messages[index])
        text, result = _text(message), _result(message)
        if tokens(len(text)) > limit:
            message["content"] = await summarized(text, f"{CONVERSATION}_{index}_content")
        if result is not None and tokens(len(result)) > limit:
            message["content"] = await summarized(result, f"{CONVERSATION}_{index}_toolres")
        out.append(message)
    return out[::-1]


def _split(messages: list[Message], keep: int) -> tuple[list[Message], list[Message]]:
    """The messages to summarise and those to keep: the last `keep`, and every message from the call
    of a tool whose result is among them."""
    older, kept = messages[:-keep], messages[-keep:]
    missing: set[str] = set()
    called: set[str] = set()
    for message in kept:
        called.update(str(call.get("id")) for call in message.get("tool_calls") or [])
        if message.get("role") == "tool" and str(message.get("tool_call_id")) not in called:
            missing.add(str(message.get("tool_call_id")))
    if not missing:
        return older, kept
    for index, message in enumerate(older):
        if any(str(call.get("id")) in missing for call in message.get("tool_calls") or []):
            return older[:index], older[index:] + kept
    return older, kept


async def _summarize_conversation(transform: c.ConversationSummarizationTransform, messages: list[Message],
                                  ask: Ask, cache: Cache | PostgresCache | None, now: float) -> list[Message]:
    def too_long(listed: list[Message]) -> bool:
        if transform.max_num_messages is not None:
            return len(listed) > transform.max_num_messages
        assert transform.max_num_characters is not None, "the component holds one of the two"
        return _characters(listed) > transform.max_num_characters

    if not too_long(messages):
        return messages
    found = await cache.aretrieve(CONVERSATION, now) if cache is not None else None
    previous: Message | None = None
    current = messages
    if found is not None:
        previous = {"role": "user", "content": str(found["cache_content"])}
        current = [previous, *messages[int(found["prefix_size"]):]]
    if not too_long(current):
        return current
    older, kept = _split(current, transform.min_num_messages)
    contents: list[str] = []
    for message in older:
        if message is not previous:
            contents.append(f"\n\n\n{_role(message)}:\n\n")
        if _text(message):
            contents.append(_text(message))
        result = _result(message)
        if result is not None:
            contents.append(result)
    summary = await summarize(ask, transform, contents, CHUNK_TOKENS)
    if cache is not None:
        await cache.astore(CONVERSATION, {"prefix_size": len(messages) - len(kept), "cache_content": summary}, now)
    return [{"role": "user", "content": summary}, *kept]


# --------------------------------------------------------------------------- an agent's transforms


def _postgres(ctx: RunContext, node: str, transform: c.MessageSummarizationTransform
              | c.ConversationSummarizationTransform, store: c.PostgresDatabaseDatastore,
              rows: list[dict[str, Any]]) -> PostgresCache:
    # The table's keys are the conversation's id, as the reference's are; a session keeps it (as the
    # one row of this cache's entry) so that its later turns find their summaries, and journals it so
    # that a run resumed before its conversation was stored reads the same rows.
    if not rows:
        journal, made = ctx.journal, uuid.uuid4().hex
        if journal is not None:
            key = journal.key("c")
            found, value = journal.recorded(key)
            if found:
                made = str(value)
            else:
                journal.record(key, made)
        rows.append({"cache_key": made, "cache_content": "", "created_at": 0, "last_used_at": 0})
    entity = CONVERSATION_COLUMNS if isinstance(transform, c.ConversationSummarizationTransform) else MESSAGE_COLUMNS
    return PostgresCache(transform, store, entity, str(rows[0]["cache_key"]), ctx.journal,
                         f"{transform.component_type} {transform.name!r} of node {node!r}")


MESSAGE_COLUMNS = list(c.MESSAGE_CACHE_ENTITY)
CONVERSATION_COLUMNS = list(c.CONVERSATION_CACHE_ENTITY)


class AgentTransforms:
    """The transforms of one agent's conversation, with their caches."""

    def __init__(self, ctx: RunContext, node: str, agent: c.Agent, *, lasting: bool) -> None:
        self.ctx, self.node, self.agent = ctx, node, agent
        # A top-level agent in a session keeps its caches with its conversation.
        stored = ctx.conversation.caches if lasting and ctx.conversation is not None else {}
        self.caches: list[Cache | PostgresCache | None] = []
        for index, transform in enumerate(agent.transforms):
            if not transform.caches():
                self.caches.append(None)
                continue
            store = transform.datastore
            where = f"{store.id or store.name}:{transform.cache_collection_name}" if store is not None else f"#{index}"
            rows = stored.setdefault(f"{agent.id or agent.name}/{where}", [])
            if isinstance(store, c.PostgresDatabaseDatastore):
                self.caches.append(_postgres(ctx, node, transform, store, rows))
                continue
            self.caches.append(Cache(transform, rows))

    def _now(self) -> float:
        journal = self.ctx.journal
        if journal is None:
            return time.time()
        key = journal.key("c")
        found, value = journal.recorded(key)
        if found:
            return float(value)
        now = time.time()
        journal.record(key, now)
        return now

    async def _ask(self, llm: c.LlmConfig, parts: list[str]) -> str:
        # One user message of text parts, as the reference's client sends it; no tools.
        message = {"role": "user", "content": [{"type": "text", "text": part} for part in parts]}
        turn = await self.ctx.chat(ModelRequest(self.node, self.ctx.endpoint(llm), [message]))
        return turn.content or ""

    async def apply(self, messages: list[Message]) -> list[Message]:
        """What the model is sent of `messages` (a system prompt first, if any, then the conversation)."""
        head = 1 if messages and messages[0].get("role") == "system" else 0
        conversation = list(messages[head:])
        now = self._now()
        for transform, cache in zip(self.agent.transforms, self.caches, strict=True):
            if isinstance(transform, c.MessageSummarizationTransform):
                conversation = await _summarize_messages(transform, conversation, self._ask, cache, now)
            else:
                conversation = await _summarize_conversation(transform, conversation, self._ask, cache, now)
        return [*messages[:head], *conversation]
