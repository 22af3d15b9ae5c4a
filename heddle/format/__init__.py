"""The `.heddle` format, readable against bundle-format/SPEC.md: framing, tar, manifest, paths,
limits, signing, keys, trust, staging, the cache and the one-pass verifier, and the packer.

It imports nothing of the engine (the tools' fingerprints are handed to the verifier as a
function), so a verifier can be read, tested and reused on its own.
"""
