"""The three PATCH flavours: JSON merge patch, strategic merge patch, JSON patch.

Strategic merge patch needs each list's merge key, which the real server
reads from the Go types. Here a table keyed by field name stands in for the
types (``containers`` merge on ``name``, ``ports`` on ``containerPort`` or
``port`` ...), which covers what ``kubectl apply`` sends for the kinds the
stand-in serves, with the directives it uses: ``$patch`` (replace, delete,
merge), ``$retainKeys``, ``$setElementOrder/<list>`` and
``$deleteFromPrimitiveList/<list>``.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.kubestub.status import ApiError

__all__ = ["apply_json_patch", "merge_key_for", "merge_patch", "strategic_merge_patch"]

_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "secrets": "name",
    "resourceClaims": "name",
}
# Lists of scalars that merge as sets rather than being replaced.
_MERGED_SCALAR_LISTS = frozenset({"finalizers"})


def _patch_error(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def merge_key_for(field: str, items: list[Any]) -> str | None:
    """The merge key of the list ``field`` (None: the list is atomic)."""
    if field == "ports":
        if any(isinstance(item, dict) and "containerPort" in item for item in items):
            return "containerPort"
        return "port"
    return _MERGE_KEYS.get(field)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch (as ``kubectl apply`` and ``kubectl patch`` send)."""
    if not isinstance(patch, dict):
        raise _patch_error("a strategic merge patch must be a JSON object")
    result = _merge_map(target if isinstance(target, dict) else {}, patch)
    return {} if result is None else result


def _merge_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any] | None:
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    body = {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "replace":
        replaced: dict[str, Any] = _strip_directives(body)
        return replaced
    if directive not in (None, "merge"):
        raise _patch_error(f"unknown patch type: {directive}")
    result = copy.deepcopy(target)
    retain = body.pop("$retainKeys", None)
    orders: dict[str, list[Any]] = {}
    for key in [key for key in body if key.startswith("$setElementOrder/")]:
        orders[key.split("/", 1)[1]] = body.pop(key)
    for key in [key for key in body if key.startswith("$deleteFromPrimitiveList/")]:
        field = key.split("/", 1)[1]
        doomed = body.pop(key)
        if isinstance(result.get(field), list) and isinstance(doomed, list):
            result[field] = [item for item in result[field] if item not in doomed]
    for key, value in body.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result[key] if isinstance(result.get(key), dict) else {}, value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    for field, order in orders.items():
        if isinstance(result.get(field), list) and isinstance(order, list):
            result[field] = _reorder(field, result[field], order)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    current_list = current if isinstance(current, list) else []
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [
            _strip_directives(item)
            for item in patch
            if not (isinstance(item, dict) and item.get("$patch") == "replace")
        ]
    if field in _MERGED_SCALAR_LISTS:
        union = list(current_list)
        union += [item for item in patch if item not in union]
        return union
    key = merge_key_for(field, patch + current_list)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return [_strip_directives(item) for item in patch]
    result = copy.deepcopy(current_list)
    for item in patch:
        if key not in item:
            raise _patch_error(f"map: {item} does not contain declared merge key: {key}")
        index = next(
            (
                i
                for i, old in enumerate(result)
                if isinstance(old, dict) and old.get(key) == item[key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
            continue
        if index is None:
            result.append(_strip_directives(item))
        else:
            merged = _merge_map(result[index], item)
            if merged is None:
                result.pop(index)
            else:
                result[index] = merged
    return result


def _reorder(field: str, items: list[Any], order: list[Any]) -> list[Any]:
    key = merge_key_for(field, items)

    def identity(item: Any) -> Any:
        if key is not None and isinstance(item, dict):
            return item.get(key)
        return item

    wanted = [identity(item) for item in order]
    placed = sorted(
        (item for item in items if identity(item) in wanted),
        key=lambda i: wanted.index(identity(i)),
    )
    return placed + [item for item in items if identity(item) not in wanted]


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_directives(v)
            for k, v in value.items()
            if not k.startswith("$") and v is not None
        }
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return value


def apply_json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, move, copy, test."""
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
    document = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise _patch_error("each JSON patch operation needs 'op' and 'path'")
        op, path = operation["op"], _pointer(operation["path"])
        if op == "add":
            document = _add(document, path, copy.deepcopy(operation.get("value")))
        elif op == "remove":
            document = _remove(document, path)[0]
        elif op == "replace":
            document = _remove(document, path)[0]
            document = _add(document, path, copy.deepcopy(operation.get("value")))
        elif op in ("move", "copy"):
            source = _pointer(str(operation.get("from", "")))
            value = copy.deepcopy(_get(document, source))
            if op == "move":
                document = _remove(document, source)[0]
            document = _add(document, path, value)
        elif op == "test":
            if _get(document, path) != operation.get("value"):
                raise _patch_error(f"testing value {operation['path']} failed")
        else:
            raise _patch_error(f"unexpected kind: {op}")
    return document


def _pointer(text: Any) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise _patch_error(f"invalid JSON pointer: {text!r}")
    if not text:
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/")]


def _get(document: Any, path: list[str]) -> Any:
    current = document
    for part in path:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            raise _patch_error(f"jsonpatch: the path /{'/'.join(path)} does not exist")
    return current


def _add(document: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(document, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise _patch_error(f"jsonpatch: add index out of bounds: {last}")
    else:
        raise _patch_error(f"jsonpatch: cannot add at /{'/'.join(path)}")
    return document


def _remove(document: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        raise _patch_error("jsonpatch: cannot remove the whole document")
    parent = _get(document, path[:-1])
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        return document, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return document, parent.pop(int(last))
    raise _patch_error(f"jsonpatch: the path /{'/'.join(path)} does not exist")
