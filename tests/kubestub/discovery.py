"""Discovery: ``/version``, ``/api``, ``/apis`` (legacy and aggregated) and OpenAPI v3.

kubectl 1.32 asks ``/api`` and ``/apis`` for the aggregated format
(``apidiscovery.k8s.io/v2``, one request for everything) and falls back to
the legacy per-group-version documents when the answer is plain JSON; both
are served, chosen by the Accept header as the real server chooses.

OpenAPI v3 is served because ``kubectl apply`` reads it: the verifier that
decides whether the server validates fields itself (``fieldValidation``)
looks for that parameter on each kind's PATCH operation. The documents carry
paths and parameters but no schemas. OpenAPI v2 is a 404, as on a server
that disables it: kubectl asks for it only when v3 lacks a kind's schema, to
compute a strategic merge patch, and then quietly uses its built-in types.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from aiohttp import web

from tests.kubestub.kinds import ResourceKind, group_versions, kinds_in
from tests.kubestub.status import path_not_found

__all__ = [
    "AGGREGATED_V2",
    "AGGREGATED_V2BETA1",
    "VERSION_INFO",
    "handle_discovery",
    "handle_openapi",
]

AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "emulationMajor": "1",
    "emulationMinor": "32",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "31",
    "gitVersion": "v1.32.0-kubestub",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}
"""What ``/version`` answers: a 1.32 server, so kubectl 1.32 sees no version skew."""


def _json(body: Any, content_type: str = "application/json") -> web.Response:
    return web.Response(body=json.dumps(body).encode(), headers={"Content-Type": content_type})


def _accepts(accept: str, media: str) -> bool:
    """Whether the Accept header lists ``media`` (parameters compared as a set)."""
    wanted = _params(media)
    return any(_params(part) == wanted for part in accept.split(","))


def _params(media: str) -> frozenset[str]:
    return frozenset(part.strip().lower() for part in media.split(";") if part.strip())


def _legacy_resources(group: str, version: str) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for kind in kinds_in(group, version):
        entry: dict[str, Any] = {
            "name": kind.plural,
            "singularName": kind.singular,
            "namespaced": kind.namespaced,
            "kind": kind.kind,
            "verbs": list(kind.verbs),
        }
        if kind.short_names:
            entry["shortNames"] = list(kind.short_names)
        if kind.categories:
            entry["categories"] = list(kind.categories)
        resources.append(entry)
        for sub in kind.subresources:
            sub_entry: dict[str, Any] = {
                "name": f"{kind.plural}/{sub.name}",
                "singularName": "",
                "namespaced": kind.namespaced,
                "kind": sub.kind,
                "verbs": list(sub.verbs),
            }
            if (sub.group, sub.version) != (kind.group, kind.version):
                sub_entry["group"] = sub.group
                sub_entry["version"] = sub.version
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def _group(group: str) -> dict[str, Any]:
    versions = [
        {"groupVersion": f"{group}/{version}", "version": version}
        for g, version in group_versions()
        if g == group
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _discovery_resource(kind: ResourceKind) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "resource": kind.plural,
        "responseKind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "scope": "Namespaced" if kind.namespaced else "Cluster",
        "singularResource": kind.singular,
        "verbs": list(kind.verbs),
    }
    if kind.short_names:
        entry["shortNames"] = list(kind.short_names)
    if kind.categories:
        entry["categories"] = list(kind.categories)
    if kind.subresources:
        entry["subresources"] = [
            {
                "subresource": sub.name,
                "responseKind": {"group": sub.group, "version": sub.version, "kind": sub.kind},
                "verbs": list(sub.verbs),
            }
            for sub in kind.subresources
        ]
    return entry


def _aggregated(core: bool, api_version: str) -> dict[str, Any]:
    items = []
    groups: list[str] = []
    for group, _ in group_versions():
        if (group == "") == core and group not in groups:
            groups.append(group)
    for group in groups:
        metadata: dict[str, Any] = {"creationTimestamp": None}
        if group:
            metadata["name"] = group
        versions = [
            {
                "version": version,
                "resources": [_discovery_resource(kind) for kind in kinds_in(group, version)],
                "freshness": "Current",
            }
            for g, version in group_versions()
            if g == group
        ]
        items.append({"metadata": metadata, "versions": versions})
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": api_version,
        "metadata": {},
        "items": items,
    }


def handle_discovery(
    request: web.Request, parts: list[str], *, aggregated: bool = True
) -> web.Response | None:
    """Answer a discovery path (split on ``/``), or None if ``parts`` is not one.

    ``aggregated`` False serves only the legacy documents, as an older server does.
    """
    accept = request.headers.get("Accept", "") if aggregated else "application/json"
    if parts == ["version"]:
        return _json(VERSION_INFO)
    if parts in (["api"], ["apis"]):
        core = parts == ["api"]
        for media, version in (
            (AGGREGATED_V2, "apidiscovery.k8s.io/v2"),
            (AGGREGATED_V2BETA1, "apidiscovery.k8s.io/v2beta1"),
        ):
            if _accepts(accept, media):
                response = _json(_aggregated(core, version), media)
                response.headers["Vary"] = "Accept"
                return response
        if core:
            return _json(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}
                    ],
                }
            )
        groups: list[dict[str, Any]] = []
        for group, _ in group_versions():
            if group and all(g["name"] != group for g in groups):
                groups.append(_group(group))
        return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    if parts == ["api", "v1"]:
        return _json(_legacy_resources("", "v1"))
    if len(parts) == 2 and parts[0] == "apis" and any(g == parts[1] for g, _ in group_versions()):
        return _json({"kind": "APIGroup", "apiVersion": "v1", **_group(parts[1])})
    if len(parts) == 3 and parts[0] == "apis" and (parts[1], parts[2]) in group_versions():
        return _json(_legacy_resources(parts[1], parts[2]))
    return None


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _openapi_document(group: str, version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for kind in kinds_in(group, version):
        if "patch" not in kind.verbs:
            continue
        base = "/" + _gv_path(group, version)
        if kind.namespaced:
            base += "/namespaces/{namespace}"
        gvk = {"group": group, "version": version, "kind": kind.kind}
        parameters = [
            {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for name in ("dryRun", "fieldManager", "fieldValidation", "force")
        ]
        paths[f"{base}/{kind.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{kind.kind}",
                "parameters": parameters,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
            },
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": VERSION_INFO["gitVersion"]},
        "paths": paths,
        "components": {"schemas": {}},
    }


def _openapi_documents() -> dict[str, bytes]:
    return {
        _gv_path(group, version): json.dumps(_openapi_document(group, version)).encode()
        for group, version in group_versions()
    }


_DOCUMENTS = _openapi_documents()


def handle_openapi(request: web.Request, parts: list[str]) -> web.Response:
    """Answer ``/openapi/...``: the v3 index and one document per group version."""
    if parts == ["openapi", "v3"]:
        index = {
            "paths": {
                path: {
                    "serverRelativeURL": f"/openapi/v3/{path}?hash="
                    + hashlib.sha512(body).hexdigest().upper()
                }
                for path, body in _DOCUMENTS.items()
            }
        }
        return _json(index)
    path = "/".join(parts[2:])
    if parts[:2] == ["openapi", "v3"] and path in _DOCUMENTS:
        response = web.Response(body=_DOCUMENTS[path], content_type="application/json")
        if request.query.get("hash"):
            response.headers["Cache-Control"] = "public, immutable"
        return response
    raise path_not_found()
