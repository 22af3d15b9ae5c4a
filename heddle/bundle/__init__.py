"""From a flow on disk to a sealed bundle, and from a verified bundle to something the engine runs.

The `.heddle` format itself (framing, manifest, signatures, verification, the cache) is
`heddle.format`, which imports nothing of the engine; this package is the glue between it and
the engine: what a bundle holds (`plan`, `collect`), the tools' fingerprints, the verified `Bundle`
(`verified`), its data folder, requirements and diffs.
"""
