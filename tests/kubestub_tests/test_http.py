"""The stand-in at the HTTP level: Status bodies, watch semantics, negotiation, upgrades."""

from __future__ import annotations

import asyncio
import io
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.kubestub import KubeStub, StubSettings
from tunnel_pki.tls import client_context

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


class Http:
    """An HTTP client for the stand-in, authenticated with its admin token."""

    def __init__(self, stub: KubeStub, session: aiohttp.ClientSession) -> None:
        self.stub = stub
        self.session = session
        self.ssl = client_context(stub.ca_pem)

    def request(self, method: str, path: str, *, token: str | None = None, **options: Any) -> Any:
        headers = {"Authorization": f"Bearer {token or self.stub.token}"}
        headers.update(options.pop("headers", {}))
        return self.session.request(
            method, self.stub.url + path, headers=headers, ssl=self.ssl, **options
        )

    async def json(self, method: str, path: str, **options: Any) -> tuple[int, Any]:
        async with self.request(method, path, **options) as response:
            return response.status, await response.json(content_type=None)


@pytest.fixture
async def http(stub: KubeStub) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession() as session:
        yield Http(stub, session)


async def _event(response: aiohttp.ClientResponse) -> dict[str, Any]:
    line = await asyncio.wait_for(response.content.readline(), 10)
    assert line, "the watch ended"
    event: dict[str, Any] = json.loads(line)
    return event


def _configmap(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}}


async def test_unauthenticated_requests_get_a_401_status(http: Http) -> None:
    status, body = await http.json("GET", "/api/v1/pods", token="wrong")
    assert status == 401
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


async def test_unknown_paths_and_methods_get_404_and_405(http: Http) -> None:
    status, body = await http.json("GET", "/apis/nope/v1/things")
    assert (status, body["reason"], body["message"]) == (
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
    status, body = await http.json("POST", "/api/v1/namespaces/default/pods/demo", json={})
    assert (status, body["reason"]) == (405, "MethodNotAllowed")


async def test_create_conflict_and_delete_bodies(http: Http) -> None:
    status, created = await http.json("POST", CONFIGMAPS, json=_configmap("c1"))
    assert status == 201
    assert created["metadata"]["resourceVersion"]
    status, body = await http.json("POST", CONFIGMAPS, json=_configmap("c1"))
    assert (status, body["reason"], body["details"]) == (
        409,
        "AlreadyExists",
        {"name": "c1", "kind": "configmaps"},
    )
    stale = {**created, "data": {"a": "b"}}
    stale["metadata"] = {**created["metadata"], "resourceVersion": "1"}
    status, body = await http.json("PUT", f"{CONFIGMAPS}/c1", json=stale)
    assert (status, body["reason"]) == (409, "Conflict")
    status, body = await http.json("DELETE", f"{CONFIGMAPS}/c1")
    assert (status, body["status"], body["details"]["kind"]) == (200, "Success", "configmaps")
    status, body = await http.json("DELETE", "/api/v1/namespaces/default/pods/demo")
    assert (status, body["kind"]) == (200, "Pod")
    assert body["metadata"]["deletionTimestamp"]


async def test_merge_and_json_patches(http: Http) -> None:
    await http.json("POST", CONFIGMAPS, json={**_configmap("c2"), "data": {"a": "1", "b": "2"}})
    status, merged = await http.json(
        "PATCH",
        f"{CONFIGMAPS}/c2",
        data=json.dumps({"data": {"a": None, "c": "3"}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert (status, merged["data"]) == (200, {"b": "2", "c": "3"})
    ops = [{"op": "replace", "path": "/data/b", "value": "9"}, {"op": "remove", "path": "/data/c"}]
    status, patched = await http.json(
        "PATCH",
        f"{CONFIGMAPS}/c2",
        data=json.dumps(ops),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert (status, patched["data"]) == (200, {"b": "9"})


async def test_watch_streams_added_modified_deleted_as_they_happen(
    http: Http, stub: KubeStub
) -> None:
    rv = stub.store.resource_version
    async with http.request("GET", f"{CONFIGMAPS}?watch=1&resourceVersion={rv}") as response:
        assert response.headers["Transfer-Encoding"] == "chunked"
        await http.json("POST", CONFIGMAPS, json=_configmap("w1"))
        added = await _event(response)
        assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "w1")
        await http.json(
            "PATCH",
            f"{CONFIGMAPS}/w1",
            data=json.dumps({"data": {"k": "v"}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        modified = await _event(response)
        assert (modified["type"], modified["object"]["data"]) == ("MODIFIED", {"k": "v"})
        await http.json("DELETE", f"{CONFIGMAPS}/w1")
        assert (await _event(response))["type"] == "DELETED"


async def test_watch_resumes_from_a_resource_version(http: Http, stub: KubeStub) -> None:
    rv = stub.store.resource_version
    await http.json("POST", CONFIGMAPS, json=_configmap("r1"))
    await http.json("POST", CONFIGMAPS, json=_configmap("r2"))
    async with http.request("GET", f"{CONFIGMAPS}?watch=true&resourceVersion={rv}") as response:
        names = [(await _event(response))["object"]["metadata"]["name"] for _ in range(2)]
    assert names == ["r1", "r2"]


async def test_watch_from_a_compacted_resource_version_is_410_expired(
    http: Http, stub: KubeStub
) -> None:
    rv = stub.store.resource_version
    await http.json("POST", CONFIGMAPS, json=_configmap("old"))
    stub.store.compact()
    async with http.request("GET", f"{CONFIGMAPS}?watch=1&resourceVersion={rv}") as response:
        assert response.status == 200
        event = await _event(response)
        assert await response.content.read() == b""
    assert event["type"] == "ERROR"
    status = event["object"]
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Expired", 410)
    assert status["message"].startswith(f"too old resource version: {rv}")


async def test_watch_without_resource_version_starts_with_current_objects(http: Http) -> None:
    async with http.request("GET", "/api/v1/pods?watch=1") as response:
        event = await _event(response)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "demo")


async def test_label_selector_watch_sees_objects_leave_and_enter(
    http: Http, stub: KubeStub
) -> None:
    await http.json("POST", CONFIGMAPS, json=_configmap("sel", team="a"))
    rv = stub.store.resource_version
    url = f"{CONFIGMAPS}?watch=1&labelSelector=team%3Da&resourceVersion={rv}"
    async with http.request("GET", url) as response:
        for team, expected in (("b", "DELETED"), ("a", "ADDED")):
            await http.json(
                "PATCH",
                f"{CONFIGMAPS}/sel",
                data=json.dumps({"metadata": {"labels": {"team": team}}}),
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert (await _event(response))["type"] == expected


async def test_watch_initial_events_end_with_an_annotated_bookmark(http: Http) -> None:
    url = (
        "/api/v1/namespaces/default/pods?watch=1&sendInitialEvents=true"
        "&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
    )
    async with http.request("GET", url) as response:
        added = await _event(response)
        bookmark = await _event(response)
    assert added["type"] == "ADDED"
    assert bookmark["type"] == "BOOKMARK"
    annotations = bookmark["object"]["metadata"]["annotations"]
    assert annotations == {"k8s.io/initial-events-end": "true"}


async def test_watch_timeout_seconds_ends_the_stream(http: Http) -> None:
    async with http.request("GET", f"{CONFIGMAPS}?watch=1&timeoutSeconds=1") as response:
        assert await asyncio.wait_for(response.content.read(), 10) == b""


async def test_bookmarks_arrive_on_idle_watches() -> None:
    settings = StubSettings(bookmark_interval=0.05)
    async with KubeStub(settings=settings) as stub, aiohttp.ClientSession() as session:
        client = Http(stub, session)
        url = f"{CONFIGMAPS}?watch=1&allowWatchBookmarks=true&resourceVersion=0"
        async with client.request("GET", url) as response:
            event = await _event(response)
    assert event["type"] == "BOOKMARK"
    assert event["object"]["kind"] == "ConfigMap"


async def test_table_and_metadata_representations(http: Http) -> None:
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    async with http.request(
        "GET", "/api/v1/pods?includeObject=Object", headers={"Accept": accept}
    ) as response:
        assert response.headers["Content-Type"] == "application/json;as=Table;v=v1;g=meta.k8s.io"
        table = await response.json(content_type=None)
    assert [c["name"] for c in table["columnDefinitions"]][:5] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    assert table["rows"][0]["cells"][:4] == ["demo", "1/1", "Running", "0"]
    assert table["rows"][0]["object"]["kind"] == "Pod"
    meta = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
    status, listing = await http.json("GET", "/api/v1/pods", headers={"Accept": meta})
    assert (status, listing["kind"]) == (200, "PartialObjectMetadataList")
    status, body = await http.json(
        "GET", "/api/v1/pods", headers={"Accept": "application/vnd.kubernetes.protobuf"}
    )
    assert (status, body["reason"]) == (406, "NotAcceptable")


async def test_discovery_is_aggregated_or_legacy_by_accept(http: Http) -> None:
    aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    async with http.request("GET", "/apis", headers={"Accept": aggregated}) as response:
        assert response.headers["Content-Type"] == aggregated
        body = await response.json(content_type=None)
    assert body["kind"] == "APIGroupDiscoveryList"
    assert [item["metadata"]["name"] for item in body["items"]][:2] == ["apps", "batch"]
    status, legacy = await http.json("GET", "/apis", headers={"Accept": "application/json"})
    assert (status, legacy["kind"]) == (200, "APIGroupList")
    status, resources = await http.json("GET", "/api/v1")
    names = {resource["name"] for resource in resources["resources"]}
    assert {"pods", "pods/log", "pods/exec", "pods/portforward"} <= names


async def test_exec_needs_a_websocket_upgrade_and_refuses_spdy(http: Http) -> None:
    url = "/api/v1/namespaces/default/pods/demo/exec?command=true&stdout=true"
    status, body = await http.json("POST", url)
    assert (status, body["message"]) == (400, "Upgrade request required")
    status, body = await http.json(
        "POST", url, headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
    )
    assert status == 400
    assert body["message"].startswith("exec over SPDY is not supported by this server")


async def test_exec_over_v4_channels(http: Http) -> None:
    url = "/api/v1/namespaces/default/pods/demo/exec?command=sh&command=-c&command=exit+2&stdout=1"
    async with http.session.ws_connect(
        http.stub.url + url,
        protocols=("v4.channel.k8s.io",),
        headers={"Authorization": f"Bearer {http.stub.token}"},
        ssl=http.ssl,
    ) as socket:
        assert socket.protocol == "v4.channel.k8s.io"
        message = await socket.receive_bytes(timeout=10)
    assert message[0] == 3
    status = json.loads(message[1:])
    assert status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "2"}]


async def test_port_forward_over_the_websocket_channel_protocol(http: Http) -> None:
    url = "/api/v1/namespaces/default/pods/demo/portforward?ports=8080"
    async with http.session.ws_connect(
        http.stub.url + url,
        protocols=("v4.channel.k8s.io",),
        headers={"Authorization": f"Bearer {http.stub.token}"},
        ssl=http.ssl,
    ) as socket:
        first = [await socket.receive_bytes(timeout=10) for _ in range(2)]
        assert first == [b"\x00" + struct.pack("<H", 8080), b"\x01" + struct.pack("<H", 8080)]
        await socket.send_bytes(b"\x00ping")
        assert await socket.receive_bytes(timeout=10) == b"\x00ping"


async def test_a_body_over_the_limit_is_413(http: Http) -> None:
    big = {**_configmap("big"), "data": {"x": "y" * (3 * 1024 * 1024)}}
    status, body = await http.json(
        "POST",
        CONFIGMAPS,
        data=io.BytesIO(json.dumps(big).encode()),
        headers={"Content-Type": "application/json"},
    )
    assert (status, body["reason"]) == (413, "RequestEntityTooLarge")
