"""A durable run SIGKILLed 20 times at random moments and resumed each time: no completed call runs
again, at most one call per kill runs again and always with its earlier idempotency key, and the
outputs are those of the same run never killed (tests/sessions/chaos.py; 200 kills in scripts/bench)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from tests.sessions.chaos import check, run_chaos
from tests.sessions.support import SESSION_KEY
from tests.support.cli import env_with

# Each killed run gets at most two calls further: enough calls that the run is still going at the 20th kill.
CALLS = 42


def test_a_durable_run_killed_twenty_times_repeats_no_completed_call(tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1 << 30))
    done = run_chaos(tmp_path, kills=20, calls=CALLS, seed=seed, env=env_with({"HEDDLE_SESSION_KEY": SESSION_KEY}))
    assert done.kills == 20, f"seed {seed}: the run finished after {done.kills} kills"
    check(done, CALLS)
