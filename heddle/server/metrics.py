"""The server's Prometheus metrics, in a registry of its own (never the process-global one)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Runs take from milliseconds (a tool chain) to minutes (an agent with a slow model).
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

# Tools sent with a request have caller-chosen names; one label value keeps the series bounded.
REQUEST_TOOL = "(request)"


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
        self._serving = False
        self._by_outcome: dict[str, Any] = {}

    def bundle_served(self, sealed: Any, oci_digest: str | None) -> None:
        """`sealed` (a SealedRun, or None for a server of flows) is what is served from now on."""
        if sealed is None:
            return
        from heddle.bundle.verified import digest_text

        if self._serving:
            self.swaps.inc()
        self._serving = True
        self.bundle.clear()
        self.bundle.labels(name=sealed.name, digest=digest_text(str(sealed.digest)), oci_digest=oci_digest or "").set(1)

    def bundle_refused(self, oci_digest: str, reason: str, when: float) -> None:
        self.refusals.inc()
        self.last_refusal.set(when)
        self.refused.clear()
        self.refused.labels(oci_digest=oci_digest, reason=reason).set(1)

    def pull_failed(self) -> None:
        self.pull_errors.inc()

    def runs_changed(self, active: int) -> None:
        self.active.set(active)
        self.saturation.set(active / self.max_concurrent)

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

    def tool_called(self, tool: str, ok: bool) -> None:
        self.tool_calls.labels(tool=tool, outcome="ok" if ok else "error").inc()

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
