"""Opening a bundle for `heddle run` and `heddle validate`: `heddle.open_bundle` with the
terminal's progress bar, and the notes a person should read about what was opened."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heddle.bundle.verified import Bundle
    from heddle.format.trust import TrustPolicy


def open_verified(target: Path, *, trust: TrustPolicy, data_dir: Path | None, fmt: str | None, verbose: bool,
                  seed_data: bool = True, plugins: Sequence[Path] = ()) -> Bundle:
    """Verify the bundle against `trust` and return it; say where `rw` mounts were seeded."""
    from heddle.bundle.verified import open_bundle
    from heddle.cli.progress import terminal_progress

    bundle = open_bundle(target, trust=trust, data_dir=data_dir, seed_data=seed_data, plugins=plugins,
                         flow_format=fmt, progress=terminal_progress())
    if bundle.repaired:
        sys.stderr.write(f"warning: the cached copy of {target} could not be proved ({bundle.repaired}); "
                         "it was removed and the bundle verified again\n")
    if verbose:
        who = ", ".join(bundle.signers) or "nobody (unsigned, admitted by --allow-unsigned)"
        sys.stderr.write(f"verified {target}: {bundle.digest}, signed by {who}\n")
    if seed_data and any(m.mode == "rw" for m in bundle.runnable.mounts):
        sys.stderr.write(f"rw mounts are seeded in {bundle.data_dir}\n")
    return bundle
