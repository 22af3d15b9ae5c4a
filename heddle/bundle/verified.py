"""A bundle opened for running: proved against a `TrustPolicy`, then described and runnable.

`open_bundle` is the one door both shells and library callers go through: the same
verification (and exit codes) as `heddle verify`, the sealed flow parsed once after every
payload byte matched, and `rw` mounts seeded into a writable data folder. A `Bundle` owns
that folder when it made it: `close()` (or leaving a `with` block) removes it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.bundle.runnable import SealedRun
    from heddle.format.manifest import Manifest
    from heddle.format.progress import Progress
    from heddle.format.trust import TrustPolicy

StrPath = str | os.PathLike[str]


@dataclass(frozen=True, eq=False)
class Bundle:
    """A verified bundle. Pass it to `heddle.run`; `runnable` is what the engine is handed."""

    path: Path
    runnable: SealedRun

    @property
    def name(self) -> str:
        return self.runnable.name

    @property
    def digest(self) -> str:
        """`sha256:<hex>` of the signed manifest (a format-1 bundle: `legacy-<hex>` of the file)."""
        return digest_text(self.runnable.digest)

    @property
    def signers(self) -> tuple[str, ...]:
        """The ids of the trusted keys whose signatures verified; empty for an admitted unsigned bundle."""
        return tuple(self.runnable.signers)

    @property
    def input(self) -> Mapping[str, Any]:
        """The input the bundle proposes for a run given none."""
        return MappingProxyType(self.runnable.input)

    @property
    def manifest(self) -> Manifest:
        manifest: Manifest = self.runnable.manifest
        return manifest

    @property
    def flow(self) -> Flow:
        """The sealed flow, parsed from the verified tree."""
        flow: Flow = self.runnable.flow
        return flow

    @property
    def data_dir(self) -> Path | None:
        """Where the `rw` mounts were seeded; None when the bundle has none (or was opened unseeded)."""
        return self.runnable.data_dir

    @property
    def repaired(self) -> str | None:
        """Why a cached copy was not trusted (it was removed and the bundle verified again), or None."""
        return self.runnable.repaired

    def close(self) -> None:
        """Remove the data folder opening made for `rw` mounts (never one the caller gave)."""
        remove_data_dir(self.runnable)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def digest_text(digest: str) -> str:
    """A digest as every report prints it: the format-1 key as it is, else with its `sha256:`."""
    return digest if digest.startswith(("sha256:", "legacy-")) else f"sha256:{digest}"


def remove_data_dir(runnable: SealedRun | None) -> None:
    """Remove the data folder opening made for `rw` mounts, unless the caller gave it."""
    if runnable is not None and runnable.data_dir_created and runnable.data_dir is not None:
        shutil.rmtree(runnable.data_dir, ignore_errors=True)


def open_bundle(
    path: StrPath,
    *,
    trust: TrustPolicy,
    data_dir: StrPath | None = None,
    seed_data: bool = True,
    cache_dir: StrPath | None = None,
    plugins: Sequence[StrPath] = (),
    flow_format: str | None = None,
    progress: Progress | None = None,
) -> Bundle:
    """Verify the bundle at `path` against `trust` and return it, ready to run.

    Raises a `heddle.HeddleError` subclass whose `exit_code` says what failed: 3 unsigned,
    4 signed by no trusted key, 5 a bad signature from a trusted key, 6 content that does not
    match the manifest, 7 malformed or over a cap, 8 made by a newer heddle. `plugins` are
    manifests of plugins given beside the bundle (read, not started) whose node types its
    sealed flow may use. `data_dir` keeps the `rw` mounts between runs; without it they are
    seeded into a temporary folder that `Bundle.close()` removes. `seed_data=False` seeds
    nothing (to check a bundle without running it).
    """
    from heddle.bundle.runnable import open_runnable
    from heddle.format.trust import TrustPolicy

    if not isinstance(trust, TrustPolicy):
        from heddle.errors import UsageError

        # A list of key files here would otherwise be read as "trust" of some kind: refuse it.
        raise UsageError(f"trust={trust!r}: give a heddle.TrustPolicy (TrustPolicy.keys(...), "
                         "TrustPolicy.store() or TrustPolicy.allow_unsigned())")
    node_types: frozenset[str] = frozenset()
    if plugins:
        from heddle.plugin_host.carried import read_carried

        node_types = read_carried([Path(p) for p in plugins]).node_types
    bundle_path = Path(path)
    from heddle.engine.tracing import DIGEST, SIGNER, verify_span

    with verify_span() as span:
        runnable = open_runnable(
            bundle_path, trust=trust, data_dir=Path(data_dir) if data_dir is not None else None, seed_data=seed_data,
            cache_root=Path(cache_dir) if cache_dir is not None else None, fmt=flow_format, progress=progress,
            node_types=node_types,
        )
        if span is not None:
            span.set_attributes({DIGEST: digest_text(runnable.digest), SIGNER: list(runnable.signers),
                                 "heddle.bundle.name": runnable.name, "heddle.bundle.cached": runnable.cached})
    return Bundle(bundle_path, runnable)
