"""Server-side apply and managedFields, without HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kubestub.apply import record_update, server_side_apply
from tests.kubestub.kinds import require_kind
from tests.kubestub.status import ApiError

CONFIGMAPS = require_kind("", "v1", "configmaps")


def _cm(**data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data}


def test_first_apply_owns_every_field_it_sets() -> None:
    created = server_side_apply(None, _cm(a="1"), "ci", CONFIGMAPS, force=False)
    (entry,) = created["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["fieldsType"]) == (
        "ci",
        "Apply",
        "FieldsV1",
    )
    assert entry["fieldsV1"] == {"f:data": {"f:a": {}}}


def test_fields_no_longer_applied_are_removed_unless_someone_else_owns_them() -> None:
    live = server_side_apply(None, _cm(a="1", b="2"), "ci", CONFIGMAPS, force=False)
    edited = {**live, "data": {**live["data"], "c": "3"}}
    record_update(live, edited, "human", CONFIGMAPS)
    reapplied = server_side_apply(edited, _cm(a="1"), "ci", CONFIGMAPS, force=False)
    assert reapplied["data"] == {"a": "1", "c": "3"}
    managers = {e["manager"]: e["fieldsV1"] for e in reapplied["metadata"]["managedFields"]}
    assert managers == {"human": {"f:data": {"f:c": {}}}, "ci": {"f:data": {"f:a": {}}}}


def test_a_field_another_manager_changed_conflicts_until_forced() -> None:
    live = server_side_apply(None, _cm(a="1"), "ci", CONFIGMAPS, force=False)
    edited = {**live, "data": {"a": "2"}}
    record_update(live, edited, "human", CONFIGMAPS)
    with pytest.raises(ApiError) as caught:
        server_side_apply(edited, _cm(a="3"), "ci", CONFIGMAPS, force=False)
    assert caught.value.code == 409
    assert caught.value.message == (
        'Apply failed with 1 conflict: conflict with "human" using v1: .data.a'
    )
    forced = server_side_apply(edited, _cm(a="3"), "ci", CONFIGMAPS, force=True)
    assert forced["data"] == {"a": "3"}
    assert [e["manager"] for e in forced["metadata"]["managedFields"]] == ["ci"]


def test_list_items_are_owned_by_their_merge_key() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }
    created = server_side_apply(None, pod, "ci", require_kind("", "v1", "pods"), force=False)
    fields = created["metadata"]["managedFields"][0]["fieldsV1"]
    assert fields == {
        "f:spec": {"f:containers": {'k:{"name":"app"}': {".": {}, "f:image": {}, "f:name": {}}}}
    }


def test_an_update_that_changes_nothing_keeps_managed_fields_as_they_were() -> None:
    live = server_side_apply(None, _cm(a="1"), "ci", CONFIGMAPS, force=False)
    same = {**live, "metadata": {**live["metadata"], "managedFields": []}}
    record_update(live, same, "other", CONFIGMAPS)
    assert same["metadata"]["managedFields"] == live["metadata"]["managedFields"]
