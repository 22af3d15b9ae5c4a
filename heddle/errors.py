"""The error hierarchy. Every error carries the exit code the CLI uses for it.

Messages are one line that names the file, field, node, tool or key at fault and,
where there is one, what to do about it.
"""

from __future__ import annotations


class HeddleError(Exception):
    """Base of every error heddle reports to a user."""

    exit_code: int = 1
    kind: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(HeddleError):
    """The command line or a setting is wrong; nothing ran."""

    exit_code = 2
    kind = "usage_error"


class DocumentError(HeddleError):
    """The flow document cannot be read, parsed or resolved."""

    exit_code = 2
    kind = "invalid_flow"


class GraphError(DocumentError):
    """The flow parsed but its graph is not runnable. Holds every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "; ".join(self.problems)
        super().__init__(f"invalid flow: {lines}")


class RunError(HeddleError):
    """A run started and failed."""

    exit_code = 1
    kind = "run_failed"


class MissingInputError(RunError):
    """The run was not given an input its flow's StartNode declares (without a default): the caller's
    mistake, so a usage error's status (as heddle-server answers it 400). Still a RunError: a
    CatchExceptionNode catches it in a subflow as WayFlow does."""

    exit_code = 2
    kind = "missing_input"


class ToolError(RunError):
    """A tool call failed: bad exit, bad output, timeout."""

    kind = "tool_failed"

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"tool {tool!r}: {message}")
        self.tool = tool


class ToolInputError(ToolError):
    """A ToolNode's arguments do not match its tool's input schema, so the tool was not started:
    the values the run was given, or made from them, are wrong for it."""

    kind = "invalid_tool_input"


class ModelError(RunError):
    """The model endpoint could not be reached or answered with an error."""

    kind = "model_failed"


class Overrun:
    """What came from outside (a model's answer, a remote tool's response, a tool's output) went past
    its cap or its deadline: the source failed, not the caller (over HTTP, 502)."""


class ToolOverrun(ToolError, Overrun):
    """A tool's answer past its cap or deadline: for an agent an error tool result, else a failed run."""


class NodeOverrun(RunError, Overrun):
    """A node's own request (an ApiNode's) answered past its cap or deadline."""


class ModelOverrun(ModelError, Overrun):
    """A model's answer past its cap or deadline."""


class LimitError(RunError):
    """A run limit (iterations, tool rounds, timeout) was exceeded."""

    kind = "limit_exceeded"


class CallDenied(RunError):
    """A person denied a call a ToolNode waited to make: the node fails, as the specification says (a
    CatchExceptionNode may catch it). Over HTTP the run ended as its caller answered: 422, not a 500."""

    kind = "call_denied"




class SessionError(HeddleError):
    """A session cannot be used as asked: unknown, busy, bound to another document, or answered
    with what it does not wait for. Nothing ran and nothing was written."""

    exit_code = 2
    kind = "session_error"
    http_status = 400


class SessionNotFound(SessionError):
    kind = "session_not_found"
    http_status = 404


class SessionOfAnotherDocument(SessionError):
    """The session is bound to another document (or bundle) than the one it is run with."""


class SessionConflict(SessionError):
    """Another run changed the session first (compare-and-swap on its version): this run's turn is
    not recorded; run it again on the session as it is now."""

    kind = "session_conflict"
    http_status = 409


class SessionTooLarge(SessionError):
    kind = "session_too_large"
    http_status = 413


class SessionAlreadyAnswered(SessionConflict):
    """Another answer to the same wait was claimed first: this one ran nothing."""

    kind = "already_answered"


class SessionUnreadable(SessionError):
    """A session's record is damaged, or fails its authentication (changed outside heddle, or written
    under another session key): refused, naming the session, and nothing runs. Over HTTP the store is
    at fault, not the caller: 500."""

    kind = "session_unreadable"
    http_status = 500


class StoreUnavailable(SessionError):
    """The session store cannot be opened or reached; named with its cause, before anything runs."""

    kind = "session_store_unavailable"
    http_status = 503


class NeedsSessionError(SessionError):
    """The run waits for a person or a client (an InputMessageNode, a human_in_the_loop agent in a
    flow, a tool with requires_confirmation, a ClientTool) and no session was given: refused before
    it starts where the document makes the wait certain, else when the run reaches it. Not a
    ToolError, so no agent hands it back to its model."""

    kind = "needs_session"
