"""Sealed bundles: pack a flow with its tools, mounts and plugins into one signed archive,
and open one only after proving it is exactly what a trusted key sealed.

Names are imported on first use so that importing this package costs nothing; the
format itself is specified in bundle-format/SPEC.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    # packing
    "PackPlan": "heddle.bundle.seal",
    "PackResult": "heddle.bundle.seal",
    "pack": "heddle.bundle.seal",
    "add_signature": "heddle.bundle.seal",
    "PlanFile": "heddle.bundle.collect",
    "collect_tree": "heddle.bundle.collect",
    "make_plan": "heddle.bundle.plan",
    "ToolSpec": "heddle.bundle.plan",
    # opening
    "OpenedBundle": "heddle.bundle.verify",
    "open_bundle": "heddle.bundle.verify",
    "read_unverified": "heddle.bundle.verify",
    "peek": "heddle.bundle.verify",
    "Peek": "heddle.bundle.verify",
    "flow_tool_fingerprints": "heddle.bundle.fingerprints",
    "open_runnable": "heddle.bundle.runnable",
    "SealedRun": "heddle.bundle.runnable",
    # the manifest
    "Manifest": "heddle.bundle.manifest",
    "FileEntry": "heddle.bundle.manifest",
    "ToolEntry": "heddle.bundle.manifest",
    "PluginEntry": "heddle.bundle.manifest",
    "MountEntry": "heddle.bundle.manifest",
    "Requires": "heddle.bundle.manifest",
    "Proposals": "heddle.bundle.manifest",
    "Limits": "heddle.bundle.limits",
    # keys and trust
    "SigningKey": "heddle.bundle.keys",
    "PublicKey": "heddle.bundle.keys",
    "generate_key": ("heddle.bundle.keys", "generate"),
    "load_signing_key": "heddle.bundle.keys",
    "load_public_key": "heddle.bundle.keys",
    "TrustStore": "heddle.bundle.trust",
    "resolve_trust": "heddle.bundle.trust",
    "Cache": "heddle.bundle.cache",
    # around a bundle
    "parse_requires": "heddle.bundle.requires",
    "check_requires": "heddle.bundle.requires",
    "diff_manifests": "heddle.bundle.diff",
    "seed_data_dir": "heddle.bundle.datadir",
    "terminal_progress": "heddle.bundle.progress",
    # outcomes
    "BundleError": "heddle.bundle.errors",
    "UnsignedBundleError": "heddle.bundle.errors",
    "UntrustedSignerError": "heddle.bundle.errors",
    "BadSignatureError": "heddle.bundle.errors",
    "ContentMismatchError": "heddle.bundle.errors",
    "MalformedBundleError": "heddle.bundle.errors",
    "BundleLimitError": "heddle.bundle.errors",
    "UnsupportedVersionError": "heddle.bundle.errors",
    "RequirementsUnmetError": "heddle.bundle.errors",
    "PackError": "heddle.bundle.errors",
    "KeyFileError": "heddle.bundle.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'heddle.bundle' has no attribute {name!r}")
    module, attr = target if isinstance(target, tuple) else (target, name)
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from heddle.bundle.cache import Cache
    from heddle.bundle.collect import PlanFile, collect_tree
    from heddle.bundle.datadir import seed_data_dir
    from heddle.bundle.diff import diff_manifests
    from heddle.bundle.errors import (
        BadSignatureError,
        BundleError,
        BundleLimitError,
        ContentMismatchError,
        KeyFileError,
        MalformedBundleError,
        PackError,
        RequirementsUnmetError,
        UnsignedBundleError,
        UnsupportedVersionError,
        UntrustedSignerError,
    )
    from heddle.bundle.fingerprints import flow_tool_fingerprints
    from heddle.bundle.keys import PublicKey, SigningKey, load_public_key, load_signing_key
    from heddle.bundle.keys import generate as generate_key
    from heddle.bundle.limits import Limits
    from heddle.bundle.manifest import (
        FileEntry,
        Manifest,
        MountEntry,
        PluginEntry,
        Proposals,
        Requires,
        ToolEntry,
    )
    from heddle.bundle.seal import PackPlan, PackResult, add_signature, pack
    from heddle.bundle.plan import ToolSpec, make_plan
    from heddle.bundle.progress import terminal_progress
    from heddle.bundle.requires import check_requires, parse_requires
    from heddle.bundle.runnable import SealedRun, open_runnable
    from heddle.bundle.trust import TrustStore, resolve_trust
    from heddle.bundle.verify import OpenedBundle, Peek, open_bundle, peek, read_unverified
