"""The engine: run a typed flow to its end, emitting events.

Its entry points are `heddle.engine.run.prepare_run` and `run_prepared`. They are not imported
here: `import heddle` exports the event types (`heddle.engine.events`), and reading those must
not load the flow model (pydantic) that the runner needs.
"""

from heddle.engine.options import RunOptions

__all__ = ["RunOptions"]
