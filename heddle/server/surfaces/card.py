"""The A2A agent card of the served bundle: what the agent is, where it answers, and what proves it.

The card is made for each request from the edition served at that moment, so after a swap to a new
digest (tag following) the first card served says the new one. Besides what A2A 1.0 defines, it
carries the bundle's provenance in an extension (`PROVENANCE`): its digest, the ids of the trusted
keys whose signatures verified, and each tool's input-schema fingerprint. With `--card-key` it is
signed as A2A 1.0 defines: a JWS (EdDSA, the heddle key's id as `kid`) over the JCS-canonical card
without its signatures, using a2a-sdk's own signer, so a2a-sdk's verifier checks it as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from a2a.types import AgentCard

    from heddle.format.keys import SigningKey
    from heddle.server.service import Service

# The extension carrying the bundle's provenance (a URN: it names the data, not a page to fetch).
PROVENANCE = "urn:heddle:bundle:v1"
PROTOCOL_VERSION = "1.0"
ALGORITHM = "EdDSA"  # heddle's keys are Ed25519
A2A_PATH = "/a2a"
CARD_PATH = "/.well-known/agent-card.json"
TEXT, JSON = "text/plain", "application/json"


def load_card_key(path: Path) -> SigningKey:
    """The operator's `--card-key` (KeyFileError, naming it, when it is not an Ed25519 key)."""
    from heddle.format.keys import load_signing_key

    return load_signing_key(path)


def provenance(sealed: Any, oci_digest: str | None) -> dict[str, Any]:
    """What proves what runs: the bundle's digest, its verified signers, its tools' input-schema fingerprints."""
    out: dict[str, Any] = {"digest": sealed.digest, "signers": list(sealed.signers),
                           "tools": dict(sorted(sealed.tool_fingerprints.items()))}
    if oci_digest is not None:
        out["ociDigest"] = oci_digest
    return out


def agent_card(service: Service, base_url: str, key: SigningKey | None = None) -> AgentCard:
    """The card of the bundle `service` serves now, answering at `base_url` (signed with `key`)."""
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentExtension,
        AgentInterface,
        AgentSkill,
        HTTPAuthSecurityScheme,
        SecurityRequirement,
        SecurityScheme,
        StringList,
    )
    from google.protobuf.struct_pb2 import Struct

    from heddle.agentspec.roots import document_root

    edition = service.edition
    sealed = edition.sealed
    assert sealed is not None, "a2a is served only with a bundle"
    flow = sealed.flow
    root = document_root(flow)
    url = base_url.rstrip("/") + A2A_PATH
    modes = [TEXT] if root.conversational else [JSON]
    params = Struct()
    params.update(provenance(sealed, edition.oci_digest))
    release = sealed.manifest.release if getattr(sealed, "manifest", None) is not None else None
    description = getattr(flow, "description", None) or (
        f"{sealed.name}: a sealed Agent Spec {root.component_type} served by heddle")
    card = AgentCard(
        name=sealed.name, description=description,
        version=str(release) if release is not None else provenance(sealed, None)["digest"],
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION),
            AgentInterface(url=url, protocol_binding="HTTP+JSON", protocol_version=PROTOCOL_VERSION)],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False, extensions=[AgentExtension(
            uri=PROVENANCE, description="the verified bundle this agent runs: its digest, signers and tools' "
                                        "input-schema fingerprints", required=False, params=params)]),
        default_input_modes=modes, default_output_modes=[TEXT, JSON],
        skills=[AgentSkill(id=str(getattr(flow, "id", None) or sealed.name), name=flow.name, description=description,
                           tags=["heddle", root.component_type], input_modes=modes, output_modes=[TEXT, JSON])])
    if service.config.auth_token is not None:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer")))
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    if key is not None:
        from a2a.utils.signing import create_agent_card_signer

        header = cast(Any, {"kid": key.keyid, "alg": ALGORITHM, "typ": "JOSE"})
        card = create_agent_card_signer(signing_key=cast(Any, key.key), protected_header=header)(card)
    return card


def card_json(card: AgentCard) -> dict[str, Any]:
    """The card as A2A's JSON (camelCase field names)."""
    from google.protobuf.json_format import MessageToDict

    out: dict[str, Any] = MessageToDict(card)
    return out
