"""The server's Prometheus metrics, in a registry of its own (never the process-global one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from heddle.bundle.verified import Bundle

# Runs take from milliseconds (a tool chain) to minutes (an agent with a slow model).
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

# Model calls take from a few milliseconds (a local model) to minutes (a long answer); tool calls too.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Tokens of one model call, in powers of four (as the GenAI conventions' token histogram).
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)

# Tools sent with a request have caller-chosen names; one label value keeps the series bounded. So
# do the models a request's flow names.
REQUEST_TOOL = "(request)"
REQUEST_MODEL = "(request)"

# Why the server refused something, each a label value of heddle_refusals_total: a bundle that did not
# verify (a followed tag's new digest), a request flow reaching where it may not (its model or tool URLs,
# this server's environment), a run refused a slot (busy, draining, the session cap), a tool call whose
# approval was denied.
REFUSAL_REASONS = ("verification", "egress", "admission", "approval")
# The error types (heddle.server.errors) that are refusals, by reason.
REFUSED_TYPES = {"forbidden_url": "egress", "forbidden_key": "egress", "forbidden_field": "egress",
                 "busy": "admission", "draining": "admission", "too_many_sessions": "admission",
                 "call_denied": "approval"}


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_concurrent: int) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.max_concurrent = max_concurrent
        self.active = Gauge("heddle_active_runs", "Runs in progress.", registry=self.registry)
        self.ceiling = Gauge("heddle_max_concurrent_runs", "Runs allowed at once (--max-concurrent).",
                             registry=self.registry)
        self.ceiling.set(max_concurrent)
        self.saturation = Gauge("heddle_run_saturation", "Runs in progress divided by --max-concurrent.",
                                registry=self.registry)
        self.accepted = Counter("heddle_runs_accepted", "Runs started (admitted and prepared).", registry=self.registry)
        self.rejected = Counter("heddle_runs_rejected", "Runs refused before starting, by reason (busy, draining).",
                                ["reason"], registry=self.registry)
        self.duration = Histogram("heddle_run_duration_seconds", "Run wall time, by outcome.", ["outcome"],
                                  buckets=RUN_BUCKETS, registry=self.registry)
        self.tool_calls = Counter("heddle_tool_calls", "Tool calls, by tool and outcome (ok, error).",
                                  ["tool", "outcome"], registry=self.registry)
        self.command_duration = Histogram(
            "heddle_command_duration_seconds", "Command calls (--commands), by command, revision and exit code "
            "(none: it did not run to an exit).", ["command", "revision", "exit_code"], buckets=RUN_BUCKETS,
            registry=self.registry)
        # The bundle served, and what a following server (--pull-interval) did not serve, and why.
        self.bundle = Gauge("heddle_bundle_info", "The bundle served: 1 for its name, manifest digest and OCI "
                            "digest (empty when it did not come from a registry).", ["name", "digest", "oci_digest"],
                            registry=self.registry)
        self.swaps = Counter("heddle_bundle_swaps", "Times a following server started serving a new digest.",
                             registry=self.registry)
        self.refusals = Counter("heddle_bundle_refusals", "New digests of the followed tag not served, because they "
                                "did not verify or could not be served.", registry=self.registry)
        self.last_refusal = Gauge("heddle_bundle_last_refusal_timestamp_seconds", "When the last new digest was "
                                  "refused (Unix time; 0: none was).", registry=self.registry)
        self.refused = Gauge("heddle_bundle_last_refusal_info", "The last refused digest: 1 for its OCI digest and the "
                             "kind of error (see GET /v1/capabilities for the message).", ["oci_digest", "reason"],
                             registry=self.registry)
        self.pull_errors = Counter("heddle_bundle_pull_errors", "Checks of the followed tag that could not reach or "
                                   "read the registry (retried on the next interval).", registry=self.registry)
        self.tool_duration = Histogram("heddle_tool_call_duration_seconds", "Tool calls' wall time, by tool and "
                                       "outcome (ok, error).", ["tool", "outcome"], buckets=CALL_BUCKETS,
                                       registry=self.registry)
        self.model_duration = Histogram("heddle_model_call_duration_seconds", "Model calls' wall time (retries "
                                        "included), by model and outcome (ok, error).", ["model", "outcome"],
                                        buckets=CALL_BUCKETS, registry=self.registry)
        self.tokens = Histogram("heddle_model_tokens", "Tokens of one model call as its answer reports them, by "
                                "model and type (input, output).", ["model", "type"], buckets=TOKEN_BUCKETS,
                                registry=self.registry)
        self.refusals_by_reason = Counter("heddle_refusals", "Things refused, by reason: verification, egress, "
                                          "admission, approval.", ["reason"], registry=self.registry)
        for reason in REFUSAL_REASONS:
            self.refusals_by_reason.labels(reason=reason)  # every reason shown from the start, at 0
        self._serving = False
        self._by_outcome: dict[str, Any] = {}
        # A tool's call counter and duration series, by (tool, outcome), each looked up once: tools are this
        # server's, or the one label of a request's own, so what is kept here is as many as the series.
        self._calls_by_tool: dict[tuple[str, str], Any] = {}
        self._durations_by_tool: dict[tuple[str, str], Any] = {}

    def bundle_served(self, sealed: Bundle | None, oci_digest: str | None) -> None:
        """`sealed` (a Bundle, or None for a server of flows) is what is served from now on."""
        if sealed is None:
            return
        if self._serving:
            self.swaps.inc()
        self._serving = True
        self.bundle.clear()
        self.bundle.labels(name=sealed.name, digest=sealed.digest, oci_digest=oci_digest or "").set(1)

    def bundle_refused(self, oci_digest: str, reason: str, when: float) -> None:
        self.refusals.inc()
        self.refused_for("verification")
        self.last_refusal.set(when)
        self.refused.clear()
        self.refused.labels(oci_digest=oci_digest, reason=reason).set(1)

    def pull_failed(self) -> None:
        self.pull_errors.inc()

    def count_runs(self, active: Callable[[], int]) -> None:
        """Runs in progress and saturation, read from `active` when the metrics are read (not set at each
        admission and release, two locked writes a request)."""
        self.active.set_function(active)
        self.saturation.set_function(lambda: active() / self.max_concurrent)

    def run_accepted(self) -> None:
        self.accepted.inc()

    def run_rejected(self, reason: str) -> None:
        self.rejected.labels(reason=reason).inc()

    def run_finished(self, outcome: str, seconds: float) -> None:
        # Outcomes are a handful of fixed words: each one's series is looked up once.
        series = self._by_outcome.get(outcome)
        if series is None:
            series = self._by_outcome[outcome] = self.duration.labels(outcome=outcome)
        series.observe(seconds)

    def tool_called(self, tool: str, ok: bool, duration_ms: float | None = None) -> None:
        outcome = "ok" if ok else "error"
        key = (tool, outcome)
        calls = self._calls_by_tool.get(key)
        if calls is None:
            calls = self._calls_by_tool[key] = self.tool_calls.labels(tool=tool, outcome=outcome)
        calls.inc()
        if duration_ms is not None:
            durations = self._durations_by_tool.get(key)
            if durations is None:
                durations = self._durations_by_tool[key] = self.tool_duration.labels(tool=tool, outcome=outcome)
            durations.observe(duration_ms / 1000)

    def refused_for(self, reason: str) -> None:
        self.refusals_by_reason.labels(reason=reason).inc()

    def answered(self, error_type: str | None) -> None:
        """A request answered with an error of `error_type` (None: no error): counted when it is a refusal."""
        reason = REFUSED_TYPES.get(error_type or "")
        if reason is not None and reason != "approval":  # a denied call is counted when its run ends
            self.refused_for(reason)

    def run_ended(self, run: Any) -> None:
        """A run's task is done: a run ended by a denied approval is a refusal."""
        if run.cancelled():
            return
        failure = run.exception()
        if failure is not None and getattr(failure, "kind", None) == "call_denied":
            self.refused_for("approval")

    def observer(self, *, from_request: bool) -> ModelCalls:
        """What the runs of one prepared flow tell of their model calls (a request flow's models as one)."""
        return ModelCalls(self, REQUEST_MODEL if from_request else None)

    def command_called(self, tool: str, output: Any, duration_ms: float) -> None:
        """One call of a command: its tool_result shows its revision and exit code, never its arguments
        or output (heddle.tools.command_run), and that is all a metric of it holds."""
        if tool == REQUEST_TOOL or not isinstance(output, dict) or output.get("redacted") is not True:
            return
        revision, code = output.get("revision"), output.get("exit_code")
        if not isinstance(revision, str) or not (code is None or isinstance(code, int)):
            return
        self.command_duration.labels(command=tool, revision=revision,
                                     exit_code="none" if code is None else str(code)).observe(duration_ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelCalls:
    """The model calls of one prepared flow's runs, into the server's metrics (heddle.engine.tracing.ModelObserver)."""

    def __init__(self, metrics: Metrics, label: str | None) -> None:
        self.metrics = metrics
        self.label = label  # the one model label of a request flow; None: the model's own id

    def model_called(self, model: str, seconds: float, tokens: Mapping[str, int], ok: bool) -> None:
        name = self.label or model
        self.metrics.model_duration.labels(model=name, outcome="ok" if ok else "error").observe(seconds)
        for kind, count in tokens.items():
            self.metrics.tokens.labels(model=name, type=kind).observe(count)
