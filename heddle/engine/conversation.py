"""A session's conversation: what each agent has said and been told over the turns so far, and, for
a Swarm, the agent the user is talking to now. JSON-serialisable, kept by the session store between
turns; a run reads it when it starts and updates it as its turn ends.

Messages are chat-completions messages (user, assistant with its tool calls, tool results), never a
system prompt: each turn renders the agent's prompt afresh. They are kept by key:

- a top-level Agent: its id, else its name;
- a top-level A2AAgent: its id, else its name, holding one entry `{"context_id": ID}`, the A2A
  context its turns continue (the remote agent keeps the messages: heddle.engine.a2a);
- a Swarm or a ManagerWorkers (its id, else its name, `G`): `G` holds its conversation with the
  user (whichever agent holds it now), and `G:A -> B` the conversation agent A has had with
  agent B through send_message (heddle.engine.multiagent).

`active` gives, per Swarm key, the agent the conversation was handed to (a Swarm not in it is with
its first agent). `caches` holds the rows of a top-level agent's transforms' caches
(heddle.engine.transforms), by agent and cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from heddle.errors import SessionError


@dataclass
class Conversation:
    # Each agent's (or agent pair's) messages, by the keys above.
    agents: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # The agent a Swarm handed the user's conversation to, by the Swarm's key.
    active: dict[str, str] = field(default_factory=dict)
    # The rows of each of its transforms' caches, by `AGENT/CACHE`.
    caches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out = {"agents": {key: [dict(m) for m in messages] for key, messages in self.agents.items()},
               "active": dict(self.active)}
        if self.caches:
            out["caches"] = {key: [dict(row) for row in rows] for key, rows in self.caches.items()}
        return out

    @classmethod
    def from_json(cls, data: Any) -> Conversation:
        """The conversation `as_json` gave; None is a conversation not begun. Anything else is refused:
        a session's record is heddle's own, and one that is not is not guessed at."""
        if data is None:
            return cls()
        agents, active = (data.get("agents") or {}, data.get("active") or {}) if isinstance(data, dict) else (0, 0)
        caches = data.get("caches") or {} if isinstance(data, dict) else 0
        if not (isinstance(agents, dict) and isinstance(active, dict) and isinstance(caches, dict)
                and all(isinstance(m, list) and all(isinstance(x, dict) for x in m)
                        for m in (*agents.values(), *caches.values()))
                and all(isinstance(v, str) for v in active.values())
                and all(_cache_row(row) for rows in caches.values() for row in rows)):
            raise SessionError("the session's conversation is not one heddle wrote (agents: lists of messages by "
                               "key, active: agent names by key); remove the session (heddle sessions rm NAME) "
                               "and start a new one")
        return cls(agents={str(k): [dict(x) for x in m] for k, m in agents.items()},
                   active={str(k): v for k, v in active.items()},
                   caches={str(k): [dict(x) for x in m] for k, m in caches.items()})


def _cache_row(row: dict[str, Any]) -> bool:
    numbers = (row.get("created_at"), row.get("last_used_at"), row.get("prefix_size", 0))
    return (isinstance(row.get("cache_key"), str) and isinstance(row.get("cache_content"), str)
            and all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers))
