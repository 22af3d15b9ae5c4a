"""heddle: seal Open Agent Specification flows into signed bundles and run them.

The public API is kept small and imported lazily so that `heddle --help` stays fast.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
