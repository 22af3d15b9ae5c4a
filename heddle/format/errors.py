"""The outcomes of opening, packing and signing a bundle, each with its own exit code.

Verification outcomes get codes 3..8 so a script can tell "nobody trusted signed this"
from "the bytes were tampered with" without parsing the message. The numbers are part of
the format's contract (bundle-format/SPEC.md, "Outcomes").
"""

from __future__ import annotations

from heddle.errors import HeddleError, RunError, UsageError


class BundleError(HeddleError):
    """Base of every verification outcome other than success."""


class UnsignedBundleError(BundleError):
    """The bundle carries no signature and unsigned bundles were not allowed."""

    exit_code = 3
    kind = "unsigned"


class UntrustedSignerError(BundleError):
    """Signed, but by no key the verifier trusts."""

    exit_code = 4
    kind = "untrusted_signer"


class BadSignatureError(BundleError):
    """A signature that claims a trusted key does not verify. Never skipped."""

    exit_code = 5
    kind = "bad_signature"


class ContentMismatchError(BundleError):
    """A payload file, a size, a mode or a tool fingerprint differs from the signed manifest."""

    exit_code = 6
    kind = "content_mismatch"


class MalformedBundleError(BundleError):
    """The archive breaks the format: structure, paths, entry types, order, trailing bytes."""

    exit_code = 7
    kind = "malformed"


class BundleLimitError(MalformedBundleError):
    """A count, size, depth or ratio is over a cap. Same exit code as malformed."""

    kind = "over_cap"


class UnsupportedVersionError(BundleError):
    """Made by a newer heddle: the format version is above what this one reads."""

    exit_code = 8
    kind = "unsupported_version"


class RequirementsUnmetError(RunError):
    """`requires` names something this machine lacks."""

    exit_code = 9
    kind = "requirements_unmet"


class PackError(UsageError):
    """The inputs to `heddle bundle` cannot be sealed; nothing was written."""

    kind = "pack_failed"


class KeyFileError(UsageError):
    """A key file is missing, of the wrong kind, or cannot be decrypted."""

    kind = "bad_key"
