"""heddle: seal Open Agent Specification flows into signed bundles and run them.

The public API is what this module exports (`__all__`); every other module may change without
notice. See docs/library.md:

    import heddle

    sealed = heddle.seal("flow.yaml", tools_dir="tools", sign_key="me.key", output="app.heddle")
    bundle = heddle.open_bundle(sealed.path, trust=heddle.TrustPolicy.keys("me.pub"))
    result = heddle.run(bundle, inputs={"text": "hi"})
    result.state, result.events

Importing this module stays cheap (`heddle --help` imports it): the names below are types and
functions whose modules import the engine, the flow model and the archive code only when called.
"""

__version__ = "0.1.0"

from heddle.bundle.seal import SealResult, seal
from heddle.bundle.verified import Bundle, open_bundle
from heddle.engine.events import (
    Event,
    FlowComplete,
    FlowStart,
    NodeComplete,
    NodeError,
    NodeStart,
    TokenDelta,
    ToolCall,
    ToolResult,
)

# The event named "warning": reachable as heddle.Warning but left out of __all__, so that
# `from heddle import *` never shadows the built-in Warning.
from heddle.engine.events import Warning as Warning
from heddle.errors import (
    DocumentError,
    GraphError,
    HeddleError,
    LimitError,
    ModelError,
    RunError,
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

__all__ = [
    "BadSignatureError",
    "Bundle",
    "BundleError",
    "ContentMismatchError",
    "DocumentError",
    "Event",
    "FlowComplete",
    "FlowStart",
    "GraphError",
    "HeddleError",
    "LimitError",
    "MalformedBundleError",
    "ModelError",
    "NodeComplete",
    "NodeError",
    "NodeStart",
    "RunError",
    "RunResult",
    "RunSettings",
    "SealResult",
    "TokenDelta",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "TrustPolicy",
    "UnsignedBundleError",
    "UnsupportedVersionError",
    "UntrustedSignerError",
    "UsageError",
    "__version__",
    "arun",
    "open_bundle",
    "run",
    "seal",
]
