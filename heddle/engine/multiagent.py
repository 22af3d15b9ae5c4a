"""Swarm and ManagerWorkers: one turn of a group of agents, talking with the user and with each other.

The group's conversation with the user is one thread of messages. The agent holding it (a Swarm's
first agent, or the one the conversation was handed to; a ManagerWorkers' manager) answers it, and
its final answer is the turn's answer. On the way it may call its own tools and:

- `send_message(recipient, message)`: the recipient answers `message` in the thread it keeps with
  that caller, with its own tools (and its own send_message, in a Swarm), and its final answer comes
  back as the tool's result. A ManagerWorkers' manager reaches its workers; a Swarm's agent the
  recipients of its relationships. An agent waiting for an answer cannot be asked in turn.
- `handoff_conversation(recipient)` (a Swarm whose `handoff` allows it; only the agent holding the
  user's conversation): the recipient takes the conversation over, with its history, and answers
  from then on, also in the turns that follow. Calls the same answer makes after it do not run.

Every model call goes through `ctx.chat`, every tool call of an agent through `ctx.call_tool`; the
two tools above are the group's own and are answered here, between the same tool_call and
tool_result events. What the model gets wrong with them (an unknown recipient, a bad argument) goes
back to it as an error it can recover from, as for any tool.

Each agent's system prompt is its own, its placeholders filled from the run's inputs; the agents it
can reach are listed in the two tools' descriptions. The group's declared outputs are given by the
final answer to the user, as an Agent's are; an agent answering another gives its own declared
outputs, if any, in its answer. A top-level group continues the session's conversation
(heddle.engine.conversation) and writes it back as its turn ends; one inside a flow starts afresh
each time its node runs, from its inputs, as an Agent there does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec import io
from heddle.agentspec.templates import render
from heddle.engine import events as ev
from heddle.engine import structured
from heddle.engine.agent import (
    _error,
    _looks_like_json,
    _one_call,
    answer_outputs,
    answer_shape,
    confirmed_tools,
)
from heddle.engine.conversation import Conversation
from heddle.engine.journal import WaitingFor
from heddle.engine.seams import AgentRound, ModelRequest, RoundResult, RoundStep, ToolRequest
from heddle.engine.tool_output import limits_of, tool_message
from heddle.errors import LimitError, NeedsSessionError, RunError, SessionError
from heddle.safeparse import loads_json
from heddle.tools.schema import check_arguments, function_definition

if TYPE_CHECKING:
    from heddle.engine.context import RunContext
    from heddle.model.turn import ToolCall
    from heddle.workspace.workspace import Workspace

SEND_MESSAGE, HANDOFF = c.SEND_MESSAGE, c.HANDOFF_CONVERSATION

_RECIPIENT = {"type": "string", "description": "The name of the agent, as listed in this tool's description."}
_SCHEMAS: dict[str, dict[str, Any]] = {
    SEND_MESSAGE: {"type": "object", "additionalProperties": False, "required": ["recipient", "message"],
                   "properties": {"recipient": _RECIPIENT, "message": {
                       "type": "string", "description": "What the agent is to do or answer, with everything from "
                                                        "the conversation it needs: it sees nothing else of it."}}},
    HANDOFF: {"type": "object", "additionalProperties": False, "required": ["recipient"],
              "properties": {"recipient": _RECIPIENT}},
}
_DESCRIPTIONS = {
    SEND_MESSAGE: ("Ask another agent of your group something and wait for its answer, which comes back as this "
                   "tool's result. Only you see it: pass on to whoever you are answering what they need of it. The "
                   "agent remembers what you asked it before."),
    HANDOFF: ("Hand the whole conversation with the user over to another agent of your group, better placed to "
              "answer it: that agent answers the user from now on. Make it the last tool call of your answer."),
}


def _definition(name: str, recipients: list[c.Agent]) -> dict[str, Any]:
    listed = "\n".join(f"- {agent.name}: {agent.description or '(no description)'}" for agent in recipients)
    return {"type": "function", "function": {"name": name, "parameters": _SCHEMAS[name],
                                             "description": f"{_DESCRIPTIONS[name]}\nThe agents:\n{listed}"}}


@dataclass
class _Thread:
    """A conversation of one agent: with the user (`caller` None), or with the agent that asks it."""

    key: str
    agent: str  # who answers in it (in the user's conversation: whoever holds it now)
    caller: str | None = None


@dataclass
class _Turn:
    ctx: RunContext
    node: c.AgentNode
    group: c.Swarm | c.ManagerWorkers
    inputs: dict[str, Any]
    workspace: Workspace
    key: str  # the group's key in the Conversation
    threads: dict[str, list[dict[str, Any]]]
    # The agents waiting for a send_message answer, the outermost first: none may be asked in turn.
    waiting: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.group.component_type} {self.group.name!r} (AgentNode {self.node.name!r})"

    # ------------------------------------------------------------------ who reaches whom

    def recipients(self, name: str) -> list[c.Agent]:
        if isinstance(self.group, c.Swarm):
            return self.group.recipients(name)
        return list(self.group.workers) if name == self.group.group_manager.name else []

    def group_tools(self, name: str, *, with_user: bool) -> list[str]:
        """The group's tools the agent `name` is given: none without anyone to reach."""
        if not self.recipients(name):
            return []
        if isinstance(self.group, c.ManagerWorkers):
            return [SEND_MESSAGE]
        mode = self.group.handoff_mode()
        # With both tools, only the agent holding the user's conversation can hand it over.
        handoff = mode == "always" or (mode == "optional" and with_user)
        return ([SEND_MESSAGE] if mode != "always" else []) + ([HANDOFF] if handoff else [])

    def definitions(self, agent: c.Agent, extra: list[str]) -> list[dict[str, Any]]:
        # The document's own tools for this agent (MCP, as their servers list them) replace the
        # definitions of the same name, as for an Agent.
        offered = self.ctx.document_tools.by_agent.get(agent.id or agent.name, [])
        replaced = {d["function"]["name"] for d in offered}
        own = [function_definition(t) for t in agent.tools if t.name not in replaced] + offered
        clash = sorted({d["function"]["name"] for d in own} & set(extra))
        if clash:
            raise RunError(f"{self.label}: agent {agent.name!r} is offered a tool named {clash[0]!r}, the name of "
                           "the tool heddle gives it to reach the group's other agents; rename that tool")
        return own + [_definition(name, self.recipients(agent.name)) for name in extra]

    # ------------------------------------------------------------------ one thread

    def shape(self, agent: c.Agent, *, with_user: bool) -> structured.Shape | None:
        """How the answer gives outputs: the group's, to the user; the agent's own, to another agent."""
        if with_user:
            return answer_shape(self.node)
        outputs = io.agent_outputs(agent)
        return structured.shape(outputs, optional=frozenset({"result"})) if structured.is_structured(outputs) else None

    def opening(self, agent: c.Agent, shape: structured.Shape | None, *, offers_tools: bool,
                with_user: bool) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The messages before the thread's history (the agent's system prompt, and in the user's
        conversation what the run has shown), and the response format its answer must fit."""
        system, response_format = render(agent.system_prompt, self.inputs), None
        if shape is not None:
            if not offers_tools and agent.llm_config.component_type in structured.RESPONSE_FORMAT_CONFIGS:
                response_format = shape.response_format(agent.name)
            else:
                instruction = "When you give your final answer (not a tool call): " + shape.instruction()
                system = f"{system}\n\n{instruction}" if system else instruction
        messages = [{"role": "system", "content": system}] if system else []
        if with_user:
            messages += [{"role": "assistant", "content": text} for text in self.ctx.shown]
        return messages, response_format

    async def converse(self, thread: _Thread) -> str:
        """The thread's agent (in the user's conversation, whoever holds it) runs until it answers;
        the answer, which the thread's history ends with."""
        ctx, with_user = self.ctx, thread.caller is None
        history = self.threads[thread.key]
        number, retried = 0, False
        while True:
            number += 1
            agent = self.group.member(thread.agent)
            extra = self.group_tools(agent.name, with_user=with_user)
            definitions = self.definitions(agent, extra)
            shape = self.shape(agent, with_user=with_user)
            opening, response_format = self.opening(agent, shape, offers_tools=bool(definitions), with_user=with_user)
            step = self.round_step(thread, agent, extra, definitions, response_format)
            done = await ctx.seams.agent_round(AgentRound(self.node.name, number, [*opening, *history]), step)
            if done.turn.tool_calls:
                continue
            answer = done.turn.content or ""
            try:
                if shape is not None:
                    shape.read(answer)
            except structured.AnswerMismatch as problem:
                history.append({"role": "assistant", "content": answer})
                top = ctx.message is not None and ctx.message.node is self.node
                if with_user and not top and agent.human_in_the_loop and not _looks_like_json(answer):
                    # Prose where the group's outputs were asked for: the agent is speaking to the
                    # person, and waits for the reply (the same turn continues with it).
                    if ctx.journal is None:
                        raise self._talks_to_the_user(agent) from None
                    reply = ctx.wait(WaitingFor("message", self.node.name, prompt=answer))
                    history.append({"role": "user", "content": reply.message or ""})
                    continue
                if retried:
                    assert shape is not None, "only structured outputs can mismatch"
                    raise structured.failure(f"{self.label} agent {agent.name!r}", shape, problem) from None
                retried = True
                history.append({"role": "user", "content": structured.retry_message(problem)})
                continue
            history.append({"role": "assistant", "content": answer})
            return answer

    def round_step(self, thread: _Thread, agent: c.Agent, extra: list[str], definitions: list[dict[str, Any]],
                   response_format: dict[str, Any] | None) -> RoundStep:
        """One round of `agent` in `thread`: its model's turn, and the tools that turn calls."""
        ctx, with_user = self.ctx, thread.caller is None
        history = self.threads[thread.key]
        schemas = {d["function"]["name"]: d["function"]["parameters"] for d in definitions}
        endpoint = ctx.endpoint(agent.llm_config)
        confirm = confirmed_tools(ctx, agent)
        limit = ctx.options.max_tool_rounds
        truncates = limits_of(agent.tools)  # the tools' own, tighter limits on what the model gets of a result

        def on_delta(text: str) -> None:
            ctx.emit(ev.TokenDelta(node=self.node.name, text=text))

        async def one_round(agent_round: AgentRound) -> RoundResult:
            # Only the user's conversation streams: what the agents tell each other is not shown.
            turn = await ctx.chat(ModelRequest(self.node.name, endpoint, agent_round.messages, definitions or None,
                                               on_delta if with_user else None, response_format))
            if not turn.tool_calls:
                return RoundResult(turn, [])
            if limit is not None and agent_round.number >= limit:
                raise LimitError(f"{self.label}: agent {agent.name!r} exceeded --max-tool-rounds {limit}: the "
                                 f"model was still calling tools after {agent_round.number} round(s)")
            said = turn.as_message()
            agent_round.messages.append(said)
            history.append(said)
            results, handed_to = [], None
            for call in turn.tool_calls:
                if handed_to is not None:
                    result: Any = _error(f"{call.name!r} did not run: the conversation was handed over to "
                                         f"{handed_to!r} before it")
                elif call.name in extra and call.name == SEND_MESSAGE:
                    result = await self.send_message(agent, call, schemas[SEND_MESSAGE])
                elif call.name in extra and call.name == HANDOFF:
                    result = await self.handoff(thread, agent, call, schemas[HANDOFF])
                    if thread.agent != agent.name:
                        handed_to = thread.agent
                else:
                    result = await _one_call(ctx, self.node.name, call, schemas, self.workspace, confirm)
                # The group's own tools answer in text, as the agent they heard from said it.
                message = ({"role": "tool", "tool_call_id": call.id, "content": result} if isinstance(result, str)
                           else await tool_message(ctx, self.workspace, call.id, result,
                                                   limit=truncates.get(call.name)))
                agent_round.messages.append(message)
                history.append(message)
                results.append({"id": call.id, "name": call.name, "result": result})
            return RoundResult(turn, results)

        return one_round

    def _talks_to_the_user(self, agent: c.Agent) -> NeedsSessionError:
        return NeedsSessionError(
            f"agent {agent.name!r} of {self.label} answered the user instead of giving its outputs "
            "(human_in_the_loop is true unless the document sets it false): waiting for the user's reply needs a "
            "session (--session NAME); set human_in_the_loop: false to have it always give its outputs")

    # ------------------------------------------------------------------ the group's tools

    def _arguments(self, call: ToolCall, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, Any]:
        try:
            arguments = loads_json(call.arguments or "{}")
        except ValueError as exc:
            return None, _error(f"the arguments for {call.name!r} are not valid JSON ({exc}); send a JSON object")
        filled, problem = check_arguments(schema, arguments)
        if problem is not None or filled is None:
            return None, _error(f"the arguments for {call.name!r} do not match its input schema: {problem}")
        return filled, None

    def _unreachable(self, agent: c.Agent, recipient: str, verb: str) -> Any:
        names = [a.name for a in self.recipients(agent.name)]
        if recipient in names:
            return None
        return _error(f"agent {agent.name!r} cannot {verb} {recipient!r}: the agents it can are "
                      f"{', '.join(map(repr, names))}")

    async def send_message(self, agent: c.Agent, call: ToolCall, schema: dict[str, Any]) -> Any:
        arguments, error = self._arguments(call, schema)
        if arguments is None:
            return error
        recipient, text = arguments["recipient"], arguments["message"]
        unreachable = self._unreachable(agent, recipient, "send a message to")
        if unreachable is not None:
            return unreachable
        if recipient in self.waiting:
            return _error(f"agent {recipient!r} is waiting for your answer (it asked you, or asked who asked you): "
                          "answer it instead of asking it")
        thread = _Thread(f"{self.key}:{agent.name} -> {recipient}", recipient, caller=agent.name)
        self.threads.setdefault(thread.key, []).append({"role": "user", "content": text})

        async def ask(request: ToolRequest) -> dict[str, Any]:
            self.waiting.append(agent.name)
            try:
                return {"answer": await self.converse(thread)}
            finally:
                self.waiting.pop()

        output = await self.ctx.record_tool(ToolRequest(self.node.name, SEND_MESSAGE, arguments, self.workspace,
                                                        call.id), ask)
        answer: str = output["answer"]
        return answer

    async def handoff(self, thread: _Thread, agent: c.Agent, call: ToolCall, schema: dict[str, Any]) -> Any:
        arguments, error = self._arguments(call, schema)
        if arguments is None:
            return error
        recipient = arguments["recipient"]
        unreachable = self._unreachable(agent, recipient, "hand the conversation over to")
        if unreachable is not None:
            return unreachable
        said = (f"The conversation was handed over from agent {agent.name!r} to agent {recipient!r}. The user knows; "
                "do not introduce yourself again: continue the conversation from where it stands.")

        async def hand_over(request: ToolRequest) -> dict[str, Any]:
            thread.agent = recipient
            return {"result": said}

        await self.ctx.record_tool(ToolRequest(self.node.name, HANDOFF, arguments, self.workspace, call.id), hand_over)
        return said


def _group_key(group: c.Swarm | c.ManagerWorkers) -> str:
    return group.id or group.name


async def run_multi_agent(ctx: RunContext, node: c.AgentNode, inputs: dict[str, Any]) -> dict[str, Any]:
    """One turn of the node's Swarm or ManagerWorkers: its outputs, `result` the answer to the user."""
    group = node.agent
    assert isinstance(group, c.MULTI_AGENT), "run_agent dispatches only multi-agent components here"
    key = _group_key(group)
    # The document's own top-level group talks with the run's user, and in a session continues the
    # conversation of the turns before; a group inside a flow is handed its inputs.
    top = ctx.message if ctx.message is not None and ctx.message.node is node else None
    before = ctx.conversation if top is not None and ctx.conversation is not None else Conversation()
    threads = {k: [dict(m) for m in v] for k, v in before.agents.items() if k == key or k.startswith(f"{key}:")}
    first = group.first_agent.name if isinstance(group, c.Swarm) else group.group_manager.name
    holder = before.active.get(key, first)
    if holder not in {a.name for a in c.agents_of(group)}:
        raise SessionError(f"the session's conversation with {group.component_type} {group.name!r} was handed to "
                           f"agent {holder!r}, which the document does not have; start a new session")
    user = top.text if top is not None else json.dumps(inputs, ensure_ascii=False)
    threads.setdefault(key, []).append({"role": "user", "content": user})
    with_user = _Thread(key, holder)
    async with ctx.workspaces.enter(node.name) as workspace:
        turn = _Turn(ctx, node, group, inputs, workspace, key, threads)
        answer = await turn.converse(with_user)
    outputs = answer_outputs(answer, node)
    if top is not None:
        top.answer = answer
        # Written only now: a turn that stops half-way (waiting for a person) is replayed whole.
        after = ctx.conversation if ctx.conversation is not None else Conversation()
        after.agents.update(threads)
        if isinstance(group, c.Swarm):
            after.active[key] = with_user.agent
        ctx.conversation = after
    return outputs
