"""Objects, resourceVersions and watch fan-out: the stand-in's etcd and watch cache.

Every write takes the next resourceVersion (one counter for all kinds, as
etcd's revision) and appends an event to a bounded history. A watch from a
resourceVersion replays the history after it; one older than the history
(compacted) is refused with 410 Expired, like the real watch cache. Each
watcher has a bounded queue; a watcher that falls that far behind is closed,
as the API server closes slow watchers, and its client re-watches.

Objects are plain JSON dicts. The store hands out copies, never its own.
It also keeps the namespace lifecycle a real cluster keeps: objects need an
existing namespace, deleting a namespace deletes what is in it, and a new
namespace gets its ``default`` service account.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.kubestub.kinds import ResourceKind, require_kind
from tests.kubestub.selectors import Selector
from tests.kubestub.status import already_exists, conflict, expired, not_found

__all__ = ["Store", "WatchEvent", "Watcher", "now_rfc3339"]

_NAMESPACES = require_kind("", "v1", "namespaces")
_SERVICEACCOUNTS = require_kind("", "v1", "serviceaccounts")

Key = tuple[str, str]  # (namespace or "", name)


def now_rfc3339() -> str:
    """The current time as the API server writes timestamps (seconds, UTC, ``Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change to one object: ``ADDED``, ``MODIFIED`` or ``DELETED``.

    ``obj`` is the object after the change (for DELETED, its last state with
    the deletion's resourceVersion); ``old`` the state before, for MODIFIED.
    """

    type: str
    kind: ResourceKind
    rv: int
    obj: dict[str, Any]
    old: dict[str, Any] | None = None


class Watcher:
    """One watch: its filters and the bounded queue of events it has yet to send."""

    def __init__(
        self,
        kind: ResourceKind,
        namespace: str,
        labels: Selector,
        fields: Selector,
        queue_size: int,
    ) -> None:
        self.kind = kind
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(maxsize=queue_size)
        self.closed = False

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if self.namespace and obj.get("metadata", {}).get("namespace") != self.namespace:
            return False
        return self.labels.matches(obj) and self.fields.matches(obj)

    def translate(self, event: WatchEvent) -> WatchEvent | None:
        """The event as this watcher sees it, or None if it does not concern it.

        An object that stops matching the selectors is DELETED for this
        watcher, one that starts matching is ADDED, as with the real server.
        """
        if event.kind != self.kind:
            return None
        now = self._matches(event.obj)
        before = self._matches(event.old) if event.type == "MODIFIED" else now
        if event.type != "MODIFIED":
            return event if now else None
        if now and before:
            return event
        if now:
            return WatchEvent("ADDED", event.kind, event.rv, event.obj)
        if before:
            return WatchEvent("DELETED", event.kind, event.rv, event.obj)
        return None

    def offer(self, event: WatchEvent) -> None:
        """Queue ``event`` if it concerns this watcher; close it if too far behind."""
        if self.closed:
            return
        seen = self.translate(event)
        if seen is None:
            return
        try:
            self.queue.put_nowait(seen)
        except asyncio.QueueFull:
            self.close()

    def close(self) -> None:
        """End this watch: the consumer sees None next (pending events are dropped)."""
        if self.closed:
            return
        self.closed = True
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class Store:
    """All objects of the cluster, with a resourceVersion counter and watch history."""

    def __init__(self, *, history: int = 1000, watch_queue_size: int = 1000) -> None:
        if history < 1 or watch_queue_size < 1:
            raise ValueError("history and watch_queue_size must be positive")
        self._objects: dict[ResourceKind, dict[Key, dict[str, Any]]] = {}
        self._rv = 100
        self._history: deque[WatchEvent] = deque(maxlen=history)
        self._compacted = self._rv
        self._watchers: set[Watcher] = set()
        self._queue_size = watch_queue_size
        self.listeners: list[Callable[[WatchEvent], None]] = []
        """Called with every change as it is stored (before watchers see it)."""

    @property
    def resource_version(self) -> int:
        """The current (latest) resourceVersion."""
        return self._rv

    @property
    def watcher_count(self) -> int:
        """How many watches are open."""
        return len(self._watchers)

    @property
    def compacted(self) -> int:
        """Watches from a resourceVersion older than this are refused with 410."""
        return self._compacted

    # Reads

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any]:
        """A copy of one object; NotFound if there is none."""
        obj = self._objects.get(kind, {}).get((namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return copy.deepcopy(obj)

    def find(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        """A copy of one object, or None."""
        obj = self._objects.get(kind, {}).get((namespace, name))
        return None if obj is None else copy.deepcopy(obj)

    def list(
        self,
        kind: ResourceKind,
        namespace: str = "",
        labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> list[dict[str, Any]]:
        """Copies of the matching objects, ordered by (namespace, name) as etcd orders keys."""
        labels = labels or Selector.everything()
        fields = fields or Selector.everything()
        items = []
        for key in sorted(self._objects.get(kind, {})):
            if namespace and key[0] != namespace:
                continue
            obj = self._objects[kind][key]
            if labels.matches(obj) and fields.matches(obj):
                items.append(copy.deepcopy(obj))
        return items

    # Writes

    def create(self, kind: ResourceKind, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object; fills uid, creationTimestamp, resourceVersion, generation.

        AlreadyExists if the name is taken; NotFound if its namespace is missing.
        Returns a copy of what was stored (``obj`` itself is left alone).
        """
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if kind.namespaced else ""
        name = meta["name"]
        if kind.namespaced and (("", namespace) not in self._objects.get(_NAMESPACES, {})):
            raise not_found(_NAMESPACES, namespace)
        table = self._objects.setdefault(kind, {})
        if (namespace, name) in table:
            raise already_exists(kind, name)
        if not kind.namespaced:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if "spec" in obj:
            meta["generation"] = 1
        for field in ("resourceVersion", "deletionTimestamp", "selfLink"):
            meta.pop(field, None)
        rv = self._next()
        meta["resourceVersion"] = str(rv)
        table[(namespace, name)] = copy.deepcopy(obj)
        self._emit(WatchEvent("ADDED", kind, rv, copy.deepcopy(obj)))
        if kind is _NAMESPACES:
            self._namespace_created(name)
        return obj

    def preview_create(self, kind: ResourceKind, obj: dict[str, Any]) -> dict[str, Any]:
        """What :meth:`create` would store (for ``dryRun``): same checks, nothing kept.

        The uid and creationTimestamp are filled, the resourceVersion is not,
        as in the real server's dry-run answers.
        """
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if kind.namespaced else ""
        if kind.namespaced and (("", namespace) not in self._objects.get(_NAMESPACES, {})):
            raise not_found(_NAMESPACES, namespace)
        if (namespace, meta["name"]) in self._objects.get(kind, {}):
            raise already_exists(kind, meta["name"])
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta.pop("resourceVersion", None)
        return obj

    def update(
        self, kind: ResourceKind, obj: dict[str, Any], *, check_version: bool = True
    ) -> dict[str, Any]:
        """Replace an object. Conflict if ``metadata.resourceVersion`` is set and stale.

        Immutable metadata (uid, creationTimestamp) is kept from the stored
        object; ``generation`` goes up when ``spec`` changes. Returns a copy of
        what was stored (``obj`` itself is left alone).
        """
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if kind.namespaced else ""
        name = meta["name"]
        table = self._objects.get(kind, {})
        current = table.get((namespace, name))
        if current is None:
            raise not_found(kind, name)
        wanted = meta.get("resourceVersion")
        if check_version and wanted and wanted != current["metadata"]["resourceVersion"]:
            raise conflict(
                kind,
                name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )
        old_meta = current["metadata"]
        for field in ("uid", "creationTimestamp", "deletionTimestamp"):
            if field in old_meta:
                meta[field] = old_meta[field]
        if "generation" in old_meta:
            changed = obj.get("spec") != current.get("spec")
            meta["generation"] = old_meta["generation"] + (1 if changed else 0)
        if not kind.namespaced:
            meta.pop("namespace", None)
        if _same(obj, current):
            # A no-op write keeps its resourceVersion and sends no event, as on a real server.
            return copy.deepcopy(current)
        rv = self._next()
        meta["resourceVersion"] = str(rv)
        table[(namespace, name)] = copy.deepcopy(obj)
        self._emit(WatchEvent("MODIFIED", kind, rv, copy.deepcopy(obj), copy.deepcopy(current)))
        return obj

    def delete(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any]:
        """Remove an object (and, for a namespace, everything in it); return its last state."""
        namespace = namespace if kind.namespaced else ""
        table = self._objects.get(kind, {})
        obj = table.pop((namespace, name), None)
        if obj is None:
            raise not_found(kind, name)
        if kind is _NAMESPACES:
            for other, objects in self._objects.items():
                for key in [key for key in objects if key[0] == name]:
                    self._remove(other, objects, key)
        rv = self._next()
        obj["metadata"]["resourceVersion"] = str(rv)
        self._emit(WatchEvent("DELETED", kind, rv, copy.deepcopy(obj)))
        return obj

    def _remove(self, kind: ResourceKind, table: dict[Key, dict[str, Any]], key: Key) -> None:
        obj = table.pop(key)
        rv = self._next()
        obj["metadata"]["resourceVersion"] = str(rv)
        self._emit(WatchEvent("DELETED", kind, rv, obj))

    # Watches

    def watch(
        self,
        kind: ResourceKind,
        namespace: str,
        labels: Selector,
        fields: Selector,
        since: int | None,
    ) -> Watcher:
        """Start a watch; ``since`` None replays the current objects as ADDED first.

        A ``since`` older than the history is 410 Expired (``too old resource
        version``).
        """
        watcher = Watcher(kind, namespace, labels, fields, self._queue_size)
        if since is None:
            backlog: Iterable[WatchEvent] = [
                WatchEvent("ADDED", kind, int(obj["metadata"]["resourceVersion"]), obj)
                for obj in self.list(kind, namespace, labels, fields)
            ]
        else:
            if since < self._compacted:
                raise expired(f"too old resource version: {since} ({self._compacted})")
            backlog = [event for event in self._history if event.rv > since]
        for event in backlog:
            watcher.offer(event)
        if not watcher.closed:
            self._watchers.add(watcher)
        return watcher

    def stop_watch(self, watcher: Watcher) -> None:
        """Forget a watcher whose client has gone."""
        self._watchers.discard(watcher)
        watcher.closed = True

    def compact(self) -> None:
        """Forget the whole history: every watch from an older resourceVersion now gets 410."""
        self._history.clear()
        self._compacted = self._rv

    def close(self) -> None:
        """End every watch (the server is stopping)."""
        for watcher in list(self._watchers):
            watcher.close()
        self._watchers.clear()

    # Internals

    def _next(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(self, event: WatchEvent) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(event)
        for listener in list(self.listeners):
            listener(event)
        for watcher in list(self._watchers):
            watcher.offer(event)
            if watcher.closed:
                self._watchers.discard(watcher)

    def _namespace_created(self, name: str) -> None:
        if (name, "default") not in self._objects.get(_SERVICEACCOUNTS, {}):
            self.create(
                _SERVICEACCOUNTS,
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": name},
                },
            )


def _same(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether a write changes nothing but the resourceVersion it carries."""
    strip = {
        **new,
        "metadata": {k: v for k, v in new["metadata"].items() if k != "resourceVersion"},
    }
    before = {
        **old,
        "metadata": {k: v for k, v in old["metadata"].items() if k != "resourceVersion"},
    }
    return strip == before
