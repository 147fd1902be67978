"""The resource API: routing of ``/api/v1/...`` and ``/apis/G/V/...``, and the REST verbs.

Paths are parsed as the API server parses them (namespaced and
cluster-scoped, collections across all namespaces, subresources); each
request is authorized against the policy with the verb the server would use
(``list``, ``watch``, ``get``, ``create``, ``update``, ``patch``, ``delete``,
``deletecollection``) and answered in the negotiated representation. Lists
page with ``limit``/``continue``; creates answer 201; deletes answer the
object (pods, services, namespaces) or a Success Status, as the real
registries do.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.kubestub.admission import prepare_create, prepare_update, with_status_of
from tests.kubestub.apply import manager_from_user_agent, record_update, server_side_apply
from tests.kubestub.auth import (
    Attributes,
    UserInfo,
    self_subject_access_review,
    self_subject_review,
    self_subject_rules_review,
)
from tests.kubestub.httpio import json_response, media_type, read_body, read_raw, wants_pretty
from tests.kubestub.kinds import ResourceKind, find_kind
from tests.kubestub.negotiation import Representation, negotiate
from tests.kubestub.patch import apply_json_patch, merge_patch, strategic_merge_patch
from tests.kubestub.protobuf import PROTOBUF
from tests.kubestub.selectors import parse_field_selector, parse_label_selector
from tests.kubestub.state import ClusterState
from tests.kubestub.status import (
    bad_request,
    conflict,
    expired,
    invalid,
    method_not_allowed,
    success_status,
    unsupported_media_type,
)
from tests.kubestub.store import now_rfc3339
from tests.kubestub.tables import partial_metadata, table
from tests.kubestub.watch import serve_watch

__all__ = ["ApiPath", "handle_resource", "parse_api_path"]

_RETURNS_OBJECT = frozenset({"pods", "services", "namespaces"})
_MAX_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class ApiPath:
    """A parsed resource path: the kind, the namespace and name (if any), the subresource."""

    kind: ResourceKind
    namespace: str = ""
    name: str = ""
    subresource: str = ""


def parse_api_path(parts: list[str]) -> ApiPath | None:
    """Parse ``["api", "v1", "namespaces", "ns", "pods", "x", "log"]`` and the like."""
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest or any(not part for part in rest):
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    kind = find_kind(group, version, rest[0])
    if kind is None or len(rest) > 3:
        return None
    if namespace and not kind.namespaced:
        return None
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) == 3 else ""
    if kind.namespaced and name and not namespace:
        return None
    if subresource and kind.subresource(subresource) is None:
        return None
    return ApiPath(kind, namespace, name, subresource)


def _verb(request: web.Request, path: ApiPath) -> str:
    method = request.method
    watching = request.query.get("watch", "").lower() in ("true", "1")
    if path.subresource in ("exec", "portforward", "attach"):
        return "create"
    if method == "GET":
        if watching:
            return "watch"
        return "get" if path.name else "list"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    if method == "DELETE" and not path.name:
        return "deletecollection"
    if method not in verbs:
        raise method_not_allowed("the server does not allow this method on the requested resource")
    return verbs[method]


def _respond(
    request: web.Request,
    obj: dict[str, Any],
    kind: ResourceKind,
    status: int = 200,
    representation: Representation | None = None,
) -> web.Response:
    representation = representation or negotiate(request.headers.get("Accept", ""))
    body: dict[str, Any] = obj
    if representation.form == "table" and obj.get("kind") == kind.kind:
        body = table(
            kind,
            [obj],
            resource_version=obj["metadata"].get("resourceVersion", ""),
            include_object=request.query.get("includeObject", "Metadata"),
        )
        body["apiVersion"] = f"meta.k8s.io/{representation.meta_version}"
    elif representation.form == "metadata" and obj.get("kind") == kind.kind:
        body = partial_metadata(obj)
    else:
        representation = negotiate("application/json")
    return json_response(
        body, status, content_type=representation.content_type, pretty=wants_pretty(request)
    )


async def handle_resource(
    request: web.Request, state: ClusterState, user: UserInfo, path: ApiPath
) -> web.StreamResponse:
    """Authorize and answer one request for a resource path."""
    kind = path.kind
    verb = _verb(request, path)
    state.policy.check(
        Attributes(user, verb, kind.plural, path.subresource, kind.group, path.namespace, path.name)
    )
    if "get" not in kind.verbs:
        return await _review(request, state, user, path)
    if path.subresource in ("log", "exec", "attach", "portforward"):
        return await _pod_subresource(request, state, path)
    if verb in ("list", "watch"):
        return await _list(request, state, path, verb == "watch")
    if verb == "deletecollection":
        return _delete_collection(request, state, path)
    if path.name and verb == "create":
        raise method_not_allowed("the server does not allow this method on the requested resource")
    if not path.name and verb != "create":
        raise method_not_allowed("the server does not allow this method on the requested resource")
    if verb == "get":
        obj = state.store.get(kind, path.namespace, path.name)
        if path.subresource == "scale":
            return json_response(_scale(obj), pretty=wants_pretty(request))
        return _respond(request, obj, kind)
    if verb == "create":
        return await _create(request, state, path)
    if verb == "update":
        body = await read_body(request)
        return _write(request, state, path, body, "Update")
    if verb == "patch":
        return await _patch(request, state, user, path)
    return await _delete(request, state, path)


async def _review(
    request: web.Request, state: ClusterState, user: UserInfo, path: ApiPath
) -> web.StreamResponse:
    if request.method != "POST" or path.name:
        raise method_not_allowed("the server does not allow this method on the requested resource")
    body = await read_body(request)
    if path.kind.plural == "selfsubjectaccessreviews":
        answer = self_subject_access_review(body, user, state.policy)
    elif path.kind.plural == "selfsubjectrulesreviews":
        answer = self_subject_rules_review(body, user, state.policy)
    else:
        answer = self_subject_review(user)
    return json_response(answer, 201)


async def _pod_subresource(
    request: web.Request, state: ClusterState, path: ApiPath
) -> web.StreamResponse:
    # Imported here: exec and port-forward pull in the WebSocket machinery.
    from tests.kubestub.exec import serve_exec
    from tests.kubestub.logs import serve_log
    from tests.kubestub.portforward import serve_portforward

    pod = state.store.get(path.kind, path.namespace, path.name)
    if path.subresource == "log":
        if request.method != "GET":
            raise method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        return await serve_log(request, state.logs, pod)
    if request.method not in ("GET", "POST"):
        raise method_not_allowed("the server does not allow this method on the requested resource")
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        raise bad_request(
            f"cannot exec into a container in a completed pod; current phase is {phase}"
        )
    if path.subresource in ("exec", "attach"):
        return await serve_exec(request, state, pod, attach=path.subresource == "attach")
    return await serve_portforward(request, state, pod)


def _encode_continue(rv: int, namespace: str, name: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [namespace, name]})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded))
        start = data["start"]
        return int(data["rv"]), (str(start[0]), str(start[1]))
    except (ValueError, KeyError, TypeError, IndexError, binascii.Error) as exc:
        raise bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion"
        ) from exc


async def _list(
    request: web.Request, state: ClusterState, path: ApiPath, watching: bool
) -> web.StreamResponse:
    kind = path.kind
    query = request.query
    if path.name and not watching:
        # Only a watch may name one object here (it becomes a metadata.name selector).
        raise method_not_allowed("the server does not allow this method on the requested resource")
    labels = parse_label_selector(query.get("labelSelector"))
    field_text = query.get("fieldSelector", "")
    if path.name:
        field_text = ",".join(filter(None, [field_text, f"metadata.name={path.name}"]))
    fields = parse_field_selector(field_text, kind)
    representation = negotiate(request.headers.get("Accept", ""))
    if watching:
        return await serve_watch(
            request, state, kind, path.namespace, labels, fields, representation
        )
    store = state.store
    items = store.list(kind, path.namespace, labels, fields)
    rv = store.resource_version
    token = query.get("continue", "")
    if token:
        rv, start = _decode_continue(token)
        if rv < store.compacted:
            raise expired(
                "The provided continue parameter is too old to display a consistent list result. "
                "You can start a new list without the continue parameter, or use the continue "
                "token in this response to retrieve the remainder of the results. Continuing "
                "with the provided token results in an inconsistent list - objects that were "
                "created, modified, or deleted between the time the first chunk was returned "
                "and now may show up in the list."
            )
        items = [
            item
            for item in items
            if (item["metadata"].get("namespace", ""), item["metadata"]["name"]) > start
        ]
    limit_text = query.get("limit", "")
    next_token = ""
    remaining: int | None = None
    if limit_text:
        try:
            limit = int(limit_text)
        except ValueError as exc:
            raise bad_request(f'limit: Invalid value: "{limit_text}"') from exc
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            next_token = _encode_continue(rv, last.get("namespace", ""), last["name"])
            if not labels.text and not fields.text:
                remaining = len(items) - limit
            items = items[: min(limit, _MAX_LIMIT)]
    if representation.form == "table":
        body = table(
            kind,
            items,
            resource_version=str(rv),
            include_object=query.get("includeObject", "Metadata"),
            continue_token=next_token,
            remaining=remaining,
        )
        body["apiVersion"] = f"meta.k8s.io/{representation.meta_version}"
        return json_response(body, content_type=representation.content_type)
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if next_token:
        meta["continue"] = next_token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    if representation.form == "metadata":
        body = {
            "kind": "PartialObjectMetadataList",
            "apiVersion": f"meta.k8s.io/{representation.meta_version}",
            "metadata": meta,
            "items": [partial_metadata(item) for item in items],
        }
        return json_response(body, content_type=representation.content_type)
    for item in items:
        # Items of a typed list carry no kind or apiVersion of their own.
        item.pop("kind", None)
        item.pop("apiVersion", None)
    body = {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": meta,
        "items": items,
    }
    return json_response(body, pretty=wants_pretty(request))


def _dry_run(request: web.Request) -> bool:
    values = request.query.getall("dryRun", [])
    for value in values:
        if value != "All":
            raise bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
    return bool(values)


def _manager(request: web.Request) -> str:
    manager = request.query.get("fieldManager")
    if manager is not None:
        if not manager or len(manager) > 128:
            raise bad_request("fieldManager: Invalid value: must be 1 to 128 characters")
        return manager
    return manager_from_user_agent(request.headers.get("User-Agent", ""))


async def _create(request: web.Request, state: ClusterState, path: ApiPath) -> web.Response:
    kind = path.kind
    body = await read_body(request)
    obj = prepare_create(kind, body, path.namespace)
    record_update(None, obj, _manager(request), kind)
    if _dry_run(request):
        return _respond(request, state.store.preview_create(kind, obj), kind, 201)
    created = state.store.create(kind, obj)
    return _respond(request, created, kind, 201)


def _write(
    request: web.Request,
    state: ClusterState,
    path: ApiPath,
    body: Any,
    operation: str,
    *,
    created_by_apply: bool = False,
) -> web.Response:
    """Store ``body`` as the new state of the object at ``path`` (update or patch)."""
    kind = path.kind
    current = state.store.get(kind, path.namespace, path.name)
    if not isinstance(body, dict):
        raise bad_request("the body of the request must be a JSON object")
    if path.subresource == "scale":
        replicas = (body.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise invalid(
                kind,
                path.name,
                [
                    (
                        "spec.replicas",
                        "FieldValueInvalid",
                        f"Invalid value: {replicas}: must be >= 0",
                    )
                ],
            )
        wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise conflict(
                kind,
                path.name,
                "the object has been modified; please apply your changes to the latest version "
                "and try again",
            )
        body = copy.deepcopy(current)
        body["spec"]["replicas"] = replicas
    elif path.subresource == "status":
        status = body.get("status")
        body = copy.deepcopy(current)
        if status is None:
            body.pop("status", None)
        else:
            body["status"] = status
    elif kind.subresource("status") is not None:
        body = with_status_of(body, current)
    obj = prepare_update(kind, body, current, path.namespace)
    # A write without managedFields keeps them; one that sends them changed (kubectl's
    # client-side-apply upgrade does) sets them as sent; either way, unless set
    # explicitly, the update is recorded for its manager.
    meta = obj["metadata"]
    if "managedFields" not in meta and current["metadata"].get("managedFields"):
        meta["managedFields"] = copy.deepcopy(current["metadata"]["managedFields"])
    same_fields = meta.get("managedFields") == current["metadata"].get("managedFields")
    if operation == "Update" and same_fields:
        record_update(current, obj, _manager(request), kind, path.subresource)
    if _dry_run(request):
        return _respond(request, obj, kind)
    stored = state.store.update(kind, obj)
    if path.subresource == "scale":
        return json_response(_scale(stored))
    return _respond(request, stored, kind, 201 if created_by_apply else 200)


async def _patch(
    request: web.Request, state: ClusterState, user: UserInfo, path: ApiPath
) -> web.Response:
    kind = path.kind
    content_type = media_type(request.headers.get("Content-Type", ""))
    if content_type == "application/apply-patch+yaml":
        return await _apply(request, state, user, path)
    patchers = {
        "application/merge-patch+json": merge_patch,
        "application/strategic-merge-patch+json": strategic_merge_patch,
        "application/json-patch+json": apply_json_patch,
    }
    patcher = patchers.get(content_type)
    if patcher is None:
        raise unsupported_media_type(content_type)
    body = await read_body(request)
    current = state.store.get(kind, path.namespace, path.name)
    source = _scale(current) if path.subresource == "scale" else current
    patched = patcher(source, body)
    return _write(request, state, path, patched, "Update")


async def _apply(
    request: web.Request, state: ClusterState, user: UserInfo, path: ApiPath
) -> web.Response:
    kind = path.kind
    manager = request.query.get("fieldManager")
    if not manager:
        raise invalid(
            kind,
            path.name,
            [("fieldManager", "FieldValueRequired", "Required value: is required for apply patch")],
        )
    force = request.query.get("force", "").lower() in ("true", "1")
    applied = await read_body(request, allow_yaml=True)
    if not isinstance(applied, dict):
        raise bad_request("the applied configuration must be an object")
    name = (applied.get("metadata") or {}).get("name")
    if name is not None and name != path.name:
        raise bad_request(
            f"the name of the object ({name}) does not match the name on the URL ({path.name})"
        )
    live = state.store.find(kind, path.namespace, path.name)
    if live is None:
        # As the API server: an apply that creates the object needs create as well as patch.
        state.policy.check(
            Attributes(user, "create", kind.plural, "", kind.group, path.namespace, path.name)
        )
        applied.setdefault("metadata", {})["name"] = path.name
        obj = prepare_create(kind, applied, path.namespace)
        obj = server_side_apply(None, obj, manager, kind, force=force)
        if _dry_run(request):
            return _respond(request, state.store.preview_create(kind, obj), kind, 201)
        return _respond(request, state.store.create(kind, obj), kind, 201)
    merged = server_side_apply(live, applied, manager, kind, force=force)
    return _write(request, state, path, merged, "Apply")


async def _delete(request: web.Request, state: ClusterState, path: ApiPath) -> web.Response:
    kind = path.kind
    if path.subresource:
        raise method_not_allowed("the server does not allow this method on the requested resource")
    current = state.store.get(kind, path.namespace, path.name)
    options: Any = {}
    content_type = media_type(request.headers.get("Content-Type", ""))
    if request.can_read_body and content_type != PROTOBUF:
        raw = await read_raw(request, 64 * 1024)
        if raw.strip():
            try:
                options = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise bad_request("the DeleteOptions body is not valid JSON") from exc
    preconditions = (options or {}).get("preconditions") or {} if isinstance(options, dict) else {}
    meta = current["metadata"]
    if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
        raise conflict(
            kind,
            path.name,
            f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in object "
            f"meta: {meta['uid']}",
        )
    wanted_rv = preconditions.get("resourceVersion")
    if wanted_rv and wanted_rv != meta["resourceVersion"]:
        raise conflict(
            kind,
            path.name,
            f"Precondition failed: ResourceVersion in precondition: {wanted_rv}, "
            f"ResourceVersion in object meta: {meta['resourceVersion']}",
        )
    if _dry_run(request):
        deleted = current
    else:
        if kind.plural == "pods":
            # Graceful deletion: watchers see the pod Terminating, then gone (the
            # stand-in's kubelet confirms at once).
            grace = options.get("gracePeriodSeconds") if isinstance(options, dict) else None
            terminating = copy.deepcopy(current)
            terminating["metadata"]["deletionTimestamp"] = now_rfc3339()
            terminating["metadata"]["deletionGracePeriodSeconds"] = (
                grace if isinstance(grace, int) else 30
            )
            state.store.update(kind, terminating, check_version=False)
        deleted = state.store.delete(kind, path.namespace, path.name)
    if kind.plural in _RETURNS_OBJECT:
        return _respond(request, deleted, kind)
    return json_response(success_status(kind, path.name, meta["uid"]))


def _delete_collection(request: web.Request, state: ClusterState, path: ApiPath) -> web.Response:
    kind = path.kind
    labels = parse_label_selector(request.query.get("labelSelector"))
    fields = parse_field_selector(request.query.get("fieldSelector"), kind)
    doomed = state.store.list(kind, path.namespace, labels, fields)
    deleted = []
    for item in doomed:
        meta = item["metadata"]
        if _dry_run(request):
            deleted.append(item)
        else:
            deleted.append(state.store.delete(kind, meta.get("namespace", ""), meta["name"]))
    for item in deleted:
        item.pop("kind", None)
        item.pop("apiVersion", None)
    body = {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": {"resourceVersion": str(state.store.resource_version)},
        "items": deleted,
    }
    return json_response(body)


def _scale(obj: dict[str, Any]) -> dict[str, Any]:
    """The ``autoscaling/v1`` Scale of a deployment."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in meta
        },
        "spec": {"replicas": spec.get("replicas", 0)},
        "status": {
            "replicas": (obj.get("status") or {}).get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }
