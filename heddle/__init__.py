"""heddle: seal Open Agent Specification flows into signed bundles and run them.

The public API is what this module exports (`__all__`); every other module may change without
notice. See docs/library.md:

    import heddle

    sealed = heddle.seal("flow.yaml", tools_dir="tools", sign_key="me.key", output="app.heddle")
    bundle = heddle.open_bundle(sealed.path, trust=heddle.TrustPolicy.keys("me.pub"))
    result = heddle.run(bundle, inputs={"text": "hi"})
    result.state, result.events

Importing this module stays cheap (`heddle --help` imports it): type checkers see every name
through the imports under TYPE_CHECKING, while at run time each name's module is imported the
first time the name is used (`_WHERE`).
"""

import importlib

from heddle.version import __version__

# typing's own constant, without importing typing (some 3 ms) into `heddle --version`.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from heddle.bundle.seal import SealResult, SealSettings, seal
    from heddle.bundle.verified import Bundle, open_bundle
    from heddle.engine.events import (
        Event,
        FlowComplete,
        FlowStart,
        Message,
        NodeComplete,
        NodeError,
        NodeStart,
        TokenDelta,
        ToolCall,
        ToolResult,
        Waiting,
    )

    # The event named "warning": reachable as heddle.Warning but left out of __all__, so that
    # `from heddle import *` never shadows the built-in Warning.
    from heddle.engine.events import Warning as Warning
    from heddle.errors import (
        CallDenied,
        DocumentError,
        GraphError,
        HeddleError,
        LimitError,
        ModelError,
        NeedsSessionError,
        RunError,
        SessionAlreadyAnswered,
        SessionConflict,
        SessionError,
        SessionNotFound,
        SessionTooLarge,
        SessionUnreadable,
        StoreUnavailable,
        ToolError,
        UsageError,
    )
    from heddle.format.errors import (
        BadSignatureError,
        BundleError,
        ContentMismatchError,
        MalformedBundleError,
        UnsignedBundleError,
        UnsupportedVersionError,
        UntrustedSignerError,
    )
    from heddle.format.trust import TrustPolicy
    from heddle.runs import RunResult, arun, run
    from heddle.settings import RunSettings

# Which module defines each public name: importing heddle loads none of them (`heddle --version`
# and `heddle --help` import this package), the first use of a name loads its module.
_WHERE: dict[str, str] = {
    "SealResult": "heddle.bundle.seal",
    "SealSettings": "heddle.bundle.seal",
    "seal": "heddle.bundle.seal",
    "Bundle": "heddle.bundle.verified",
    "open_bundle": "heddle.bundle.verified",
    "Event": "heddle.engine.events",
    "FlowComplete": "heddle.engine.events",
    "FlowStart": "heddle.engine.events",
    "Message": "heddle.engine.events",
    "NodeComplete": "heddle.engine.events",
    "NodeError": "heddle.engine.events",
    "NodeStart": "heddle.engine.events",
    "TokenDelta": "heddle.engine.events",
    "ToolCall": "heddle.engine.events",
    "ToolResult": "heddle.engine.events",
    "Waiting": "heddle.engine.events",
    "Warning": "heddle.engine.events",
    "DocumentError": "heddle.errors",
    "GraphError": "heddle.errors",
    "CallDenied": "heddle.errors",
    "HeddleError": "heddle.errors",
    "LimitError": "heddle.errors",
    "ModelError": "heddle.errors",
    "NeedsSessionError": "heddle.errors",
    "RunError": "heddle.errors",
    "SessionAlreadyAnswered": "heddle.errors",
    "SessionConflict": "heddle.errors",
    "SessionError": "heddle.errors",
    "SessionNotFound": "heddle.errors",
    "SessionTooLarge": "heddle.errors",
    "SessionUnreadable": "heddle.errors",
    "StoreUnavailable": "heddle.errors",
    "ToolError": "heddle.errors",
    "UsageError": "heddle.errors",
    "BadSignatureError": "heddle.format.errors",
    "BundleError": "heddle.format.errors",
    "ContentMismatchError": "heddle.format.errors",
    "MalformedBundleError": "heddle.format.errors",
    "UnsignedBundleError": "heddle.format.errors",
    "UnsupportedVersionError": "heddle.format.errors",
    "UntrustedSignerError": "heddle.format.errors",
    "TrustPolicy": "heddle.format.trust",
    "RunResult": "heddle.runs",
    "arun": "heddle.runs",
    "run": "heddle.runs",
    "RunSettings": "heddle.settings",
}


# Hidden from type checkers: a module __getattr__ would make any misspelt name type-check (as Any);
# they read the imports above instead.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module 'heddle' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # resolved once; later lookups never reach __getattr__
        return value


    def __dir__() -> list[str]:
        return sorted({*globals(), *_WHERE})


__all__ = [
    "BadSignatureError",
    "Bundle",
    "BundleError",
    "CallDenied",
    "ContentMismatchError",
    "DocumentError",
    "Event",
    "FlowComplete",
    "FlowStart",
    "GraphError",
    "HeddleError",
    "LimitError",
    "MalformedBundleError",
    "Message",
    "ModelError",
    "NeedsSessionError",
    "NodeComplete",
    "NodeError",
    "NodeStart",
    "RunError",
    "RunResult",
    "RunSettings",
    "SealResult",
    "SealSettings",
    "SessionAlreadyAnswered",
    "SessionConflict",
    "SessionError",
    "SessionNotFound",
    "SessionTooLarge",
    "SessionUnreadable",
    "StoreUnavailable",
    "TokenDelta",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "TrustPolicy",
    "UnsignedBundleError",
    "UnsupportedVersionError",
    "UntrustedSignerError",
    "UsageError",
    "Waiting",
    "__version__",
    "arun",
    "open_bundle",
    "run",
    "seal",
]
