"""Opening a bundle for `heddle run` and `heddle validate`: `heddle.open_bundle` with the
terminal's progress bar, and the notes a person should read about what was opened."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heddle.bundle.verified import Bundle
    from heddle.format.trust import TrustPolicy


def refuse_others(name: object, *, tools_dir: Path | None, components: Path | None, commands: Path | None) -> None:
    """A sealed bundle runs only its own tools, commands and components: a flag giving others is refused."""
    from heddle.errors import UsageError

    for flag, value in (("--tools-dir", tools_dir), ("--components", components), ("--commands", commands)):
        if value is not None:
            raise UsageError(f"{flag} cannot be used with the bundle {name}: a sealed bundle runs only its own "
                             "tools, commands and components")


def open_verified(target: Path, *, trust: TrustPolicy, data_dir: Path | None, fmt: str | None,
                  seed_data: bool = True, plugins: Sequence[Path] = ()) -> Bundle:
    """Verify the bundle against `trust` and return it; say where `rw` mounts were seeded (and, with
    --verbose, who signed it)."""
    from heddle.bundle.verified import open_bundle
    from heddle.cli import output
    from heddle.cli.progress import terminal_progress

    bundle = open_bundle(target, trust=trust, data_dir=data_dir, seed_data=seed_data, plugins=plugins,
                         flow_format=fmt, progress=terminal_progress())
    if bundle.repaired:
        output.warn(f"the cached copy of {target} could not be proved ({bundle.repaired}); "
                    "it was removed and the bundle verified again")
    who = ", ".join(bundle.signers) or "nobody (unsigned, admitted by --allow-unsigned)"
    output.detail(f"verified {target}: {bundle.digest}, signed by {who}")
    if seed_data and any(m.mode == "rw" for m in bundle.mounts):
        made = bundle.data_dir_created
        output.note(f"rw mounts are seeded in {bundle.data_dir}"
                    + (" (removed when the command ends; --data-dir DIR keeps them)" if made else ""))
    if bundle.data_dir_created:
        _made.append(bundle)
    return bundle


# Bundles opened with a data folder made for them: removed when the command ends, whatever its
# outcome (heddle.cli.errors.run_app), or every run would leave one in the temporary folder.
_made: list[Bundle] = []


def close_opened() -> None:
    while _made:
        _made.pop().close()
