"""The engine: run a typed flow to its end, emitting events."""

from heddle.engine.options import RunOptions
from heddle.engine.run import PreparedRun, prepare_run, run_flow, run_prepared

__all__ = ["PreparedRun", "RunOptions", "prepare_run", "run_flow", "run_prepared"]
