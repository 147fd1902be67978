"""The store: resourceVersions, conflicts, watch translation, bounded queues and history."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kubestub.kinds import require_kind
from tests.kubestub.selectors import Selector, parse_field_selector, parse_label_selector
from tests.kubestub.state import ClusterState
from tests.kubestub.status import ApiError
from tests.kubestub.store import Store

CONFIGMAPS = require_kind("", "v1", "configmaps")


def _cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels}}


def _store(**options: int) -> Store:
    store = ClusterState().store
    if options:
        store = Store(**options)
        store.create(require_kind("", "v1", "namespaces"), {"metadata": {"name": "default"}})
    return store


def test_writes_take_increasing_resource_versions_and_stale_updates_conflict() -> None:
    store = _store()
    created = store.create(CONFIGMAPS, _cm("a"))
    first = int(created["metadata"]["resourceVersion"])
    updated = store.update(CONFIGMAPS, {**created, "data": {"k": "v"}})
    assert int(updated["metadata"]["resourceVersion"]) > first
    with pytest.raises(ApiError) as caught:
        store.update(CONFIGMAPS, {**created, "data": {"k": "w"}})
    assert (caught.value.code, caught.value.reason) == (409, "Conflict")
    unchanged = store.update(CONFIGMAPS, store.get(CONFIGMAPS, "default", "a"))
    assert unchanged["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]


def test_objects_need_their_namespace_and_a_namespace_takes_its_objects_along() -> None:
    store = _store()
    namespaces = require_kind("", "v1", "namespaces")
    with pytest.raises(ApiError) as caught:
        store.create(CONFIGMAPS, {"metadata": {"name": "x", "namespace": "nope"}})
    assert caught.value.message == 'namespaces "nope" not found'
    store.create(namespaces, {"metadata": {"name": "team"}})
    assert store.find(require_kind("", "v1", "serviceaccounts"), "team", "default") is not None
    store.create(CONFIGMAPS, {"metadata": {"name": "x", "namespace": "team"}})
    store.delete(namespaces, "", "team")
    assert store.list(CONFIGMAPS, "team") == []


def test_watchers_see_objects_leave_and_enter_their_selector() -> None:
    store = _store()
    created = store.create(CONFIGMAPS, _cm("a", team="x"))
    watcher = store.watch(
        CONFIGMAPS, "default", parse_label_selector("team=x"), Selector.everything(), None
    )
    assert watcher.queue.get_nowait() is not None  # the initial ADDED
    moved = store.update(CONFIGMAPS, {**created, "metadata": {**created["metadata"], "labels": {}}})
    event = watcher.queue.get_nowait()
    assert event is not None
    assert event.type == "DELETED"
    store.update(CONFIGMAPS, {**moved, "metadata": {**moved["metadata"], "labels": {"team": "x"}}})
    event = watcher.queue.get_nowait()
    assert event is not None
    assert event.type == "ADDED"


def test_a_watcher_that_falls_behind_is_closed() -> None:
    store = _store(history=100, watch_queue_size=2)
    watcher = store.watch(
        CONFIGMAPS, "", Selector.everything(), Selector.everything(), store.resource_version
    )
    for name in ("a", "b", "c"):
        store.create(CONFIGMAPS, _cm(name))
    assert watcher.closed
    assert watcher.queue.get_nowait() is None
    assert store.watcher_count == 0


def test_history_is_bounded_and_older_resource_versions_expire() -> None:
    store = _store(history=2, watch_queue_size=10)
    start = store.resource_version
    for name in ("a", "b", "c"):
        store.create(CONFIGMAPS, _cm(name))
    with pytest.raises(ApiError) as caught:
        store.watch(CONFIGMAPS, "", Selector.everything(), Selector.everything(), start)
    assert (caught.value.code, caught.value.reason) == (410, "Expired")
    recent = store.watch(
        CONFIGMAPS, "", Selector.everything(), Selector.everything(), store.compacted
    )
    assert recent.queue.qsize() == 2


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("tier=web", ["a"]),
        ("tier!=web", ["b", "c"]),
        ("tier in (web, db)", ["a", "b"]),
        ("tier notin (web)", ["b", "c"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c"]),
        ("tier=db,zone=1", ["b"]),
    ],
)
def test_label_selectors(selector: str, names: list[str]) -> None:
    objects = [_cm("a", tier="web"), _cm("b", tier="db", zone="1"), _cm("c")]
    parsed = parse_label_selector(selector)
    assert [o["metadata"]["name"] for o in objects if parsed.matches(o)] == names


def test_field_selectors_support_names_and_refuse_unknown_fields() -> None:
    selector = parse_field_selector("metadata.name!=a,metadata.namespace=default", CONFIGMAPS)
    assert [selector.matches(_cm(name)) for name in ("a", "b")] == [False, True]
    with pytest.raises(ApiError) as caught:
        parse_field_selector("data.x=1", CONFIGMAPS)
    assert caught.value.message == "field label not supported: data.x"
