"""Content negotiation: which representation an Accept header asks for.

Clients list what they take in order of preference (kubectl: a Table, then
plain JSON). JSON objects, ``meta.k8s.io`` Tables and
``PartialObjectMetadata`` are served; protobuf and YAML are not, so a client
that only accepts those gets 406, as from a server that lacks them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.kubestub.status import not_acceptable

__all__ = ["Representation", "negotiate"]


@dataclass(frozen=True, slots=True)
class Representation:
    """What to send: ``json``, ``table`` or ``metadata``, with its Content-Type and meta version."""

    form: str
    content_type: str
    meta_version: str = "v1"


_JSON = Representation("json", "application/json")


def _parse(media: str) -> tuple[str, dict[str, str]]:
    kind, *params = (part.strip() for part in media.split(";"))
    values: dict[str, str] = {}
    for param in params:
        key, _, value = param.partition("=")
        values[key.strip().lower()] = value.strip()
    return kind.lower(), values


def negotiate(accept: str) -> Representation:
    """The representation ``accept`` prefers among those served (406 if none)."""
    if not accept.strip():
        return _JSON
    for media in accept.split(","):
        kind, params = _parse(media)
        if kind not in ("application/json", "application/*", "*/*"):
            continue
        shape = params.get("as")
        if shape is None:
            return _JSON
        if params.get("g") != "meta.k8s.io" or params.get("v") not in ("v1", "v1beta1"):
            continue
        version = params["v"]
        if shape == "Table":
            return Representation(
                "table", f"application/json;as=Table;v={version};g=meta.k8s.io", version
            )
        if shape in ("PartialObjectMetadata", "PartialObjectMetadataList"):
            return Representation(
                "metadata", f"application/json;as={shape};v={version};g=meta.k8s.io", version
            )
    raise not_acceptable(
        "only the following media types are accepted: application/json, "
        "application/json;as=Table;v=v1;g=meta.k8s.io"
    )
