"""Patches as the API server applies them: merge, strategic merge (with directives), JSON patch."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kubestub.patch import apply_json_patch, merge_patch, strategic_merge_patch
from tests.kubestub.status import ApiError

POD: dict[str, Any] = {
    "metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {
        "containers": [
            {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
            {"name": "side", "image": "side:1"},
        ],
        "tolerations": [{"key": "k"}],
    },
}


def test_merge_patch_deletes_with_null_and_replaces_lists() -> None:
    patched = merge_patch(POD, {"metadata": {"labels": {"a": None}}, "spec": {"containers": []}})
    assert patched["metadata"]["labels"] == {"b": "2"}
    assert patched["spec"]["containers"] == []


def test_strategic_merge_merges_lists_by_their_keys() -> None:
    patched = strategic_merge_patch(
        POD,
        {
            "spec": {
                "containers": [
                    {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}]},
                    {"name": "new", "image": "new:1"},
                ],
                "tolerations": [{"key": "other"}],
            },
            "metadata": {"finalizers": ["y"]},
        },
    )
    containers = patched["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [
        ("app", "app:2"),
        ("side", "side:1"),
        ("new", "new:1"),
    ]
    assert containers[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert patched["spec"]["tolerations"] == [{"key": "other"}]
    assert patched["metadata"]["finalizers"] == ["x", "y"]


def test_strategic_merge_directives() -> None:
    patched = strategic_merge_patch(
        POD,
        {
            "metadata": {
                "labels": {"$patch": "replace", "c": "3"},
                "$deleteFromPrimitiveList/finalizers": ["x"],
            },
            "spec": {
                "$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
                "containers": [{"name": "app", "$patch": "delete"}],
                "$retainKeys": ["containers"],
            },
        },
    )
    assert patched["metadata"]["labels"] == {"c": "3"}
    assert patched["spec"] == {"containers": [{"name": "side", "image": "side:1"}]}
    assert patched["metadata"]["finalizers"] == []


def test_strategic_merge_needs_the_merge_key() -> None:
    with pytest.raises(ApiError) as caught:
        strategic_merge_patch(POD, {"spec": {"containers": [{"image": "x"}]}})
    assert caught.value.code == 422


def test_json_patch_operations() -> None:
    doc = {"a": {"b": [1, 2]}, "c": "d"}
    patched = apply_json_patch(
        doc,
        [
            {"op": "add", "path": "/a/b/-", "value": 3},
            {"op": "add", "path": "/a/b/0", "value": 0},
            {"op": "replace", "path": "/c", "value": "e"},
            {"op": "copy", "from": "/c", "path": "/f"},
            {"op": "move", "from": "/f", "path": "/g"},
            {"op": "remove", "path": "/a/b/1"},
            {"op": "test", "path": "/g", "value": "e"},
        ],
    )
    assert patched == {"a": {"b": [0, 2, 3]}, "c": "e", "g": "e"}
    assert doc == {"a": {"b": [1, 2]}, "c": "d"}


def test_json_patch_failures_are_unprocessable() -> None:
    with pytest.raises(ApiError) as caught:
        apply_json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])
    assert caught.value.code == 422
    with pytest.raises(ApiError):
        apply_json_patch({"a": 1}, [{"op": "remove", "path": "/nope"}])
