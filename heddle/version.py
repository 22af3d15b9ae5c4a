"""heddle's release: the façade's `__version__`, and what the format, the OCI client and traces record."""

__version__ = "0.1.0"
