"""Server-side apply and ``metadata.managedFields``.

Each write records which manager owns which fields, in the ``FieldsV1``
format the real server writes (``{"f:data": {"f:key": {}}}``, list items as
``k:{"name":"x"}``). :func:`server_side_apply` merges an applied
configuration into the live object: fields another manager owns with a
different value are a 409 Conflict unless forced; fields this manager
applied before and no longer does are removed. List merge keys come from
:mod:`tests.kubestub.patch`, standing in for the Go types' schema.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.kubestub.kinds import ResourceKind
from tests.kubestub.patch import merge_key_for, strategic_merge_patch
from tests.kubestub.status import ApiError
from tests.kubestub.store import now_rfc3339

__all__ = ["manager_from_user_agent", "record_update", "server_side_apply"]

Path = tuple[str, ...]

_IDENTITY = frozenset({"apiVersion", "kind"})
_SERVER_METADATA = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
        "deletionTimestamp",
        "selfLink",
    }
)
_SCALAR_SETS = frozenset({"finalizers"})
_MAX_MANAGER = 128


def manager_from_user_agent(user_agent: str) -> str:
    """The manager name the server derives from a User-Agent (its part before ``/``)."""
    name = user_agent.split("/", 1)[0].strip() or "unknown"
    return name[:_MAX_MANAGER]


def _field_paths(obj: dict[str, Any], *, subresource: str = "") -> set[Path]:
    """The set of field paths ``obj`` sets, as managedFields counts them."""
    paths: set[Path] = set()
    for key, value in obj.items():
        if key in _IDENTITY:
            continue
        if key == "status" and subresource != "status":
            continue
        if subresource == "status" and key != "status":
            continue
        if key == "metadata" and isinstance(value, dict):
            meta = {k: v for k, v in value.items() if k not in _SERVER_METADATA}
            _collect(meta, ("f:metadata",), paths)
            continue
        _collect_value(key, value, ("f:" + key,), paths)
    return paths


def _collect(obj: dict[str, Any], prefix: Path, paths: set[Path]) -> None:
    for key, value in obj.items():
        _collect_value(key, value, (*prefix, "f:" + key), paths)


def _collect_value(key: str, value: Any, path: Path, paths: set[Path]) -> None:
    if isinstance(value, dict) and value:
        _collect(value, path, paths)
    elif isinstance(value, list) and value:
        merge_key = merge_key_for(key, value)
        if key in _SCALAR_SETS:
            for item in value:
                paths.add((*path, "v:" + json.dumps(item)))
        elif merge_key and all(isinstance(item, dict) and merge_key in item for item in value):
            for item in value:
                item_path = (
                    *path,
                    "k:"
                    + json.dumps(
                        {merge_key: item[merge_key]}, sort_keys=True, separators=(",", ":")
                    ),
                )
                paths.add(item_path)
                _collect(item, item_path, paths)
        else:
            paths.add(path)
    else:
        paths.add(path)


def _encode(paths: set[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for element in path:
            node = node.setdefault(element, {})
        if path and path[-1].startswith("k:"):
            node["."] = {}
    return root


def _decode(fields: Any, prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    if not isinstance(fields, dict):
        return paths
    for key, child in fields.items():
        if key == ".":
            paths.add(prefix)
            continue
        path = (*prefix, key)
        if isinstance(child, dict) and child:
            paths |= _decode(child, path)
        else:
            paths.add(path)
    return paths


def _lookup(obj: Any, path: Path) -> tuple[bool, Any]:
    """(found, value) of the field at ``path`` in ``obj``."""
    current = obj
    for element in path:
        kind, _, text = element.partition(":")
        if kind == "f" and isinstance(current, dict) and text in current:
            current = current[text]
        elif kind == "k" and isinstance(current, list):
            wanted = json.loads(text)
            match = [
                item
                for item in current
                if isinstance(item, dict) and all(item.get(k) == v for k, v in wanted.items())
            ]
            if not match:
                return False, None
            current = match[0]
        elif kind == "v" and isinstance(current, list):
            value = json.loads(text)
            if value not in current:
                return False, None
            current = value
        else:
            return False, None
    return True, current


def _remove(obj: Any, path: Path) -> None:
    """Delete the field at ``path`` from ``obj`` if it is there."""
    if not path:
        return
    found, parent = _lookup(obj, path[:-1])
    if not found:
        return
    kind, _, text = path[-1].partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(text, None)
    elif kind == "k" and isinstance(parent, list):
        wanted = json.loads(text)
        parent[:] = [
            item
            for item in parent
            if not (isinstance(item, dict) and all(item.get(k) == v for k, v in wanted.items()))
        ]
    elif kind == "v" and isinstance(parent, list):
        value = json.loads(text)
        parent[:] = [item for item in parent if item != value]


def _render(path: Path) -> str:
    """A field path as the conflict message writes it (``.spec.containers[name="x"].image``)."""
    text = ""
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            text += "." + rest
        elif kind == "k":
            keys = json.loads(rest)
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]"
        else:
            text += f"[={rest}]"
    return text


def _entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    entries = obj.get("metadata", {}).get("managedFields") or []
    return [entry for entry in entries if isinstance(entry, dict)]


def _entry(
    manager: str, operation: str, api_version: str, paths: set[Path], subresource: str
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": _encode(paths),
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def _set_entries(obj: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    kept = [entry for entry in entries if entry.get("fieldsV1")]
    meta = obj.setdefault("metadata", {})
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)


def record_update(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    manager: str,
    kind: ResourceKind,
    subresource: str = "",
) -> None:
    """Record in ``new``'s managedFields that ``manager`` wrote the fields it changed.

    Fields that changed pass to ``manager`` (operation ``Update``) from whoever
    owned them; fields that disappeared leave every manager.
    """
    new_paths = _field_paths(new, subresource=subresource)
    if old is None:
        changed = new_paths
        entries: list[dict[str, Any]] = []
    else:
        old_paths = _field_paths(old, subresource=subresource)
        changed = {path for path in new_paths if _lookup(old, path) != _lookup(new, path)}
        gone = old_paths - new_paths
        if not changed and not gone:
            # A write that changes nothing leaves ownership (and its timestamps) alone.
            _set_entries(new, _entries(old))
            return
        entries = []
        for entry in _entries(old):
            if entry.get("subresource", "") == subresource:
                paths = _decode(entry.get("fieldsV1")) - changed - gone
                entry = {**entry, "fieldsV1": _encode(paths)}
            entries.append(entry)
    mine = next(
        (
            e
            for e in entries
            if e.get("manager") == manager
            and e.get("operation") == "Update"
            and e.get("subresource", "") == subresource
        ),
        None,
    )
    if mine is not None:
        changed = changed | _decode(mine.get("fieldsV1"))
        entries.remove(mine)
    if changed:
        entries.append(_entry(manager, "Update", kind.api_version, changed, subresource))
    _set_entries(new, entries)


def server_side_apply(
    live: dict[str, Any] | None,
    applied: dict[str, Any],
    manager: str,
    kind: ResourceKind,
    *,
    force: bool,
) -> dict[str, Any]:
    """Merge the configuration ``applied`` by ``manager`` into ``live`` (None: create it).

    Raises a 409 Conflict naming the fields and their managers when another
    manager owns a field with a different value and ``force`` is false.
    """
    applied_paths = _field_paths(applied)
    if live is None:
        created = copy.deepcopy(applied)
        created.setdefault("metadata", {}).pop("managedFields", None)
        _set_entries(created, [_entry(manager, "Apply", kind.api_version, applied_paths, "")])
        return created
    entries = [copy.deepcopy(entry) for entry in _entries(live)]
    conflicts: list[tuple[str, str, Path]] = []
    others: set[Path] = set()
    previous: set[Path] = set()
    for entry in entries:
        paths = _decode(entry.get("fieldsV1"))
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            previous = paths
            continue
        if entry.get("subresource"):
            continue
        for path in sorted(paths & applied_paths):
            # A list item as a whole is not a value: only its fields conflict.
            if path[-1].startswith("k:"):
                continue
            if _lookup(live, path) != _lookup(applied, path):
                conflicts.append((str(entry.get("manager")), str(entry.get("apiVersion")), path))
        others |= paths
    if conflicts and not force:
        raise _conflict_error(conflicts)
    result: dict[str, Any] = strategic_merge_patch(live, _without_server_fields(applied))
    for path in previous - applied_paths - others:
        _remove(result, path)
    new_entries = []
    taken = {path for _, _, path in conflicts}
    for entry in entries:
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            continue
        if taken and not entry.get("subresource"):
            entry["fieldsV1"] = _encode(_decode(entry.get("fieldsV1")) - taken)
        new_entries.append(entry)
    new_entries.append(_entry(manager, "Apply", kind.api_version, applied_paths, ""))
    _set_entries(result, new_entries)
    return result


def _without_server_fields(applied: dict[str, Any]) -> dict[str, Any]:
    result = {k: v for k, v in applied.items() if k != "status"}
    meta = result.get("metadata")
    if isinstance(meta, dict):
        result["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return result


def _conflict_error(conflicts: list[tuple[str, str, Path]]) -> ApiError:
    count = len(conflicts)
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f'conflict with "{manager}" using {version}',
            "field": _render(path),
        }
        for manager, version, path in conflicts
    ]
    if count == 1:
        manager, version, path = conflicts[0]
        message = (
            f'Apply failed with 1 conflict: conflict with "{manager}" using {version}: '
            f"{_render(path)}"
        )
    else:
        lines = "\n".join(
            f'- conflict with "{manager}" using {version}: {_render(path)}'
            for manager, version, path in conflicts
        )
        message = f"Apply failed with {count} conflicts:\n{lines}"
    return ApiError(409, "Conflict", message, {"causes": causes})
