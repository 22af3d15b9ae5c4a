"""One spelling of a bundle's digest on every face: a format-1 bundle is `legacy-<hex>` (its cache key),
never `sha256:legacy-<hex>`, in the server's capabilities, validation report and refusals alike."""

from __future__ import annotations

import asyncio
from pathlib import Path

from heddle.format.trust import TrustPolicy
from heddle.server.config import ServerConfig
from heddle.server.served_bundle import open_served
from heddle.server.service import Service

LEGACY = Path(__file__).resolve().parents[2] / "bundle-format" / "vectors" / "legacy-gzip.heddle"


def test_a_format_1_bundle_is_reported_by_its_own_digest(tmp_path: Path) -> None:
    config = ServerConfig(bundle=str(LEGACY), allow_unsigned=True, data_dir=tmp_path / "data")
    service = Service(config, sealed=open_served(config, TrustPolicy.allow_unsigned()))
    try:
        sealed = service.sealed
        assert sealed is not None and sealed.digest.startswith("legacy-")
        assert service.capabilities()["bundle"]["digest"] == sealed.digest
    finally:
        asyncio.run(service.aclose())
