"""What can go wrong between heddle and a registry (or the server of a bundle's URL)."""

from __future__ import annotations

from heddle.errors import HeddleError


class RegistryError(HeddleError):
    """The registry could not be reached, refused the request, or answered what heddle does not read.
    Nothing was pulled, pushed or run; the message names the reference and what to do."""

    exit_code = 2
    kind = "registry_error"
