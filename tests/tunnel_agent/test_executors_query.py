"""The query executor against the stand-in API server (tests.kubestub)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakebin.support import Harness, command, harness
from tunnel_agent.executors import ExecutionResult, execute
from tunnel_agent.executors.context import MAX_SUMMARY_BYTES
from tunnel_agent.executors.query import MAX_RESULT_BYTES, REDACTED

SECRET = "s3cr3t-Pa55w0rd"


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        yield running


async def _query(h: Harness, spec: dict[str, Any]) -> ExecutionResult:
    return await execute(command("query", spec), h.context())


def _result(outcome: ExecutionResult) -> Any:
    assert outcome.outcome == "succeeded", outcome.error
    return outcome.summary["result"]


def _deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
            },
        },
    }


async def test_get_returns_one_object_without_managed_fields(h: Harness) -> None:
    h.stub.add(_deployment("api"))
    get = {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "api"}
    outcome = await _query(h, {"get": get})
    assert outcome.summary["query"] == "get"
    obj = _result(outcome)["object"]
    assert obj["metadata"]["name"] == "api"
    assert obj["status"]["availableReplicas"] == 1
    assert "managedFields" not in obj["metadata"]


async def test_get_lists_by_label_selector(h: Harness) -> None:
    for name in ("api", "web", "worker"):
        h.stub.add_pod(name)
    get = {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "labelSelector": "app!=web"}
    result = _result(await _query(h, {"get": get}))
    assert sorted(item["metadata"]["name"] for item in result["items"]) == ["api", "worker"]
    assert (result["count"], result["truncated"]) == (2, False)


async def test_get_lists_cluster_scoped_kinds(h: Harness) -> None:
    result = _result(await _query(h, {"get": {"apiVersion": "v1", "kind": "Namespace"}}))
    assert "kube-system" in [item["metadata"]["name"] for item in result["items"]]


async def test_a_secrets_values_never_leave_the_cluster(h: Harness) -> None:
    h.stub.add(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db", "namespace": "default"},
            "data": {"password": base64.b64encode(SECRET.encode()).decode()},
        }
    )
    get = {"apiVersion": "v1", "kind": "Secret", "namespace": "default", "name": "db"}
    outcome = await _query(h, {"get": get})
    assert _result(outcome)["object"]["data"] == {"password": REDACTED}
    listed = await _query(
        h, {"get": {"apiVersion": "v1", "kind": "Secret", "namespace": "default"}}
    )
    assert _result(listed)["items"][0]["data"] == {"password": REDACTED}
    encoded = base64.b64encode(SECRET.encode()).decode()
    for text in (json.dumps(outcome.to_dict()), json.dumps(listed.to_dict())):
        assert encoded not in text


async def test_a_list_larger_than_the_cap_is_truncated_with_a_marker(h: Harness) -> None:
    for index in range(12):
        h.stub.add(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"big-{index:02}", "namespace": "default"},
                "data": {"blob": "x" * 100_000},
            }
        )
    outcome = await _query(h, {"get": {"apiVersion": "v1", "kind": "ConfigMap"}})
    result = _result(outcome)
    assert result["truncated"] is True
    assert result["count"] >= 12
    assert 0 < len(result["items"]) < 12
    assert len(json.dumps(outcome.summary)) <= MAX_SUMMARY_BYTES


async def test_describe_gives_the_object_and_its_events(h: Harness) -> None:
    h.stub.add_pod("api")
    h.stub.add_pod("other")
    for name, pod, reason in (
        ("e1", "api", "Scheduled"),
        ("e2", "api", "Pulled"),
        ("e3", "other", "Killing"),
    ):
        h.stub.add(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": "default"},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": "default"},
                "reason": reason,
                "message": f"{reason} {pod}",
                "type": "Normal",
                "count": 1,
                "lastTimestamp": f"2024-01-01T00:00:0{name[-1]}Z",
            }
        )  # fmt: skip
    describe = {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "api"}
    result = _result(await _query(h, {"describe": describe}))
    assert result["object"]["metadata"]["name"] == "api"
    assert [(e["reason"], e["message"]) for e in result["events"]] == [
        ("Scheduled", "Scheduled api"),
        ("Pulled", "Pulled api"),
    ]


async def test_logs_return_the_pods_log(h: Harness) -> None:
    h.stub.add_pod("api")
    h.stub.append_log("default", "api", "starting\nlistening on :8080\nready")
    result = _result(await _query(h, {"logs": {"namespace": "default", "pod": "api"}}))
    assert result == {
        "log": "starting\nlistening on :8080\nready\n",
        "lines": 3,
        "truncated": False,
    }
    tail = {"namespace": "default", "pod": "api", "tailLines": 1}
    assert _result(await _query(h, {"logs": tail}))["log"] == "ready\n"


async def test_logs_of_a_missing_pod_fail_naming_it(h: Harness) -> None:
    outcome = await _query(h, {"logs": {"namespace": "default", "pod": "nope"}})
    assert outcome.error == "spec.logs: pod default/nope not found"


async def test_a_log_larger_than_the_cap_is_cut_at_a_line_with_a_marker(h: Harness) -> None:
    h.stub.add_pod("chatty")
    h.stub.append_log("default", "chatty", "\n".join(["y" * 999] * 1100))
    result = _result(await _query(h, {"logs": {"namespace": "default", "pod": "chatty"}}))
    assert result["truncated"] is True
    assert len(result["log"]) <= MAX_RESULT_BYTES
    assert result["log"].endswith("\n")
    assert set(result["log"].splitlines()) == {"y" * 999}


async def test_endpoints_list_the_pods_behind_a_service(h: Harness) -> None:
    h.stub.add_pod("api-1")
    h.stub.add(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "api", "namespace": "default"},
            "spec": {"selector": {"app": "api-1"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
    )
    result = _result(await _query(h, {"endpoints": {"namespace": "default", "service": "api"}}))
    assert result["service"]["name"] == "api"
    assert result["service"]["ports"][0]["port"] == 80
    assert result["source"] == "pods"  # the stand-in serves no EndpointSlices
    [endpoint] = result["endpoints"]
    pod = h.stub.get("v1", "Pod", "api-1", "default")
    assert pod is not None
    assert endpoint == {
        "addresses": [pod["status"]["podIP"]],
        "ready": True,
        "node": "stub-node",
        "pod": "api-1",
    }


async def test_a_missing_object_fails_naming_it(h: Harness) -> None:
    get = {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "nope"}
    outcome = await _query(h, {"get": get})
    assert (outcome.outcome, outcome.error) == (
        "failed",
        "spec.get: Deployment default/nope not found",
    )


async def test_a_named_get_of_a_namespaced_kind_needs_a_namespace(h: Harness) -> None:
    outcome = await _query(h, {"get": {"apiVersion": "v1", "kind": "Pod", "name": "api"}})
    assert outcome.error == "spec.get.namespace: required for the namespaced Pod"


async def test_an_unserved_kind_fails_naming_the_field(h: Harness) -> None:
    outcome = await _query(h, {"get": {"apiVersion": "example.com/v1", "kind": "Widget"}})
    assert outcome.error == "spec.get.kind: the cluster serves no kind Widget in example.com/v1"


async def test_a_forbidden_read_fails_with_the_api_message(h: Harness) -> None:
    h.stub.deny(verb="list", resource="pods")
    outcome = await _query(h, {"get": {"apiVersion": "v1", "kind": "Pod", "namespace": "default"}})
    assert outcome.error is not None
    assert outcome.error.startswith("spec.get: cannot list pods: HTTP 403: ")


# ----------------------------------------------- the agent's own namespace (docs/security.md)

OWN = "tunnel-agent"
REFUSED = (
    "namespace tunnel-agent is the agent's own (its credentials, command journal and bootstrap"
    " token are there); commands may not read or write in it"
)


def _in_own_namespace(h: Harness) -> None:
    """The agent's namespace, with its credentials Secret and its Pod, beside a team's."""
    for namespace in (OWN, "web"):
        h.stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    h.add_secret(OWN, "tunnel-agent-credentials", {"tls.key": SECRET})
    h.add_secret("web", "web-env", {"password": SECRET})
    h.stub.add_pod("tunnel-agent-0", OWN)
    h.stub.add_pod("web-0", "web")
    h.stub.append_log(OWN, "tunnel-agent-0", "connected")
    h.stub.add(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "tunnel-agent", "namespace": OWN},
            "spec": {"selector": {"app": "tunnel-agent-0"}, "ports": [{"port": 8081}]},
        }
    )


@pytest.mark.parametrize(
    ("operation", "fields"),
    [
        ("get", {"apiVersion": "v1", "kind": "Secret", "name": "tunnel-agent-credentials"}),
        ("get", {"apiVersion": "v1", "kind": "Secret"}),
        ("describe", {"apiVersion": "v1", "kind": "Pod", "name": "tunnel-agent-0"}),
        ("logs", {"pod": "tunnel-agent-0"}),
        ("endpoints", {"service": "tunnel-agent"}),
    ],
)
async def test_a_query_in_the_agents_own_namespace_is_refused_naming_it(
    h: Harness, operation: str, fields: dict[str, str]
) -> None:
    """Secret values there are redacted, but nothing there is for a query to read."""
    _in_own_namespace(h)
    spec = {operation: {**fields, "namespace": OWN}}
    outcome = await execute(command("query", spec), h.context(own_namespace=OWN))
    assert (outcome.outcome, outcome.error) == (
        "failed",
        f"spec.{operation}.namespace: {REFUSED}",
    )
    assert "tunnel-agent-credentials" not in json.dumps(outcome.to_dict())


async def test_the_agents_own_namespace_object_is_refused_by_name(h: Harness) -> None:
    _in_own_namespace(h)
    for operation in ("get", "describe"):
        spec = {operation: {"apiVersion": "v1", "kind": "Namespace", "name": OWN}}
        outcome = await execute(command("query", spec), h.context(own_namespace=OWN))
        assert outcome.error == f"spec.{operation}.name: {REFUSED}"
    # Another namespace's object is read as before.
    get = {"apiVersion": "v1", "kind": "Namespace", "name": "web"}
    outcome = await execute(command("query", {"get": get}), h.context(own_namespace=OWN))
    assert _result(outcome)["object"]["metadata"]["name"] == "web"


async def test_a_list_across_every_namespace_leaves_the_agents_own_out_and_says_so(
    h: Harness,
) -> None:
    _in_own_namespace(h)
    for kind in ("Secret", "Pod"):
        get = {"apiVersion": "v1", "kind": kind}
        outcome = await execute(command("query", {"get": get}), h.context(own_namespace=OWN))
        result = _result(outcome)
        assert {item["metadata"]["namespace"] for item in result["items"]} == {"web"}
        assert result["count"] == len(result["items"])
        assert result["excludedNamespace"] == OWN
        assert "tunnel-agent-credentials" not in json.dumps(outcome.to_dict())


async def test_outside_a_cluster_no_namespace_is_the_agents_own(h: Harness) -> None:
    """An agent with --credentials-dir keeps nothing in the cluster: every namespace is read."""
    _in_own_namespace(h)
    get = {"apiVersion": "v1", "kind": "Secret", "namespace": OWN}
    result = _result(await _query(h, {"get": get}))
    assert [item["metadata"]["name"] for item in result["items"]] == ["tunnel-agent-credentials"]
    listed = _result(await _query(h, {"get": {"apiVersion": "v1", "kind": "Secret"}}))
    assert "excludedNamespace" not in listed


async def test_describe_reads_no_events_in_the_agents_own_namespace(h: Harness) -> None:
    """A cluster-scoped object's events are in "default": not read when that is the agent's."""
    _in_own_namespace(h)
    h.stub.add(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "e1", "namespace": "default"},
            "involvedObject": {"kind": "Namespace", "name": "web"},
            "reason": "Seen",
            "message": "seen",
            "type": "Normal",
        }
    )
    describe = {"apiVersion": "v1", "kind": "Namespace", "name": "web"}
    outcome = await execute(command("query", {"describe": describe}), h.context())
    assert [event["reason"] for event in _result(outcome)["events"]] == ["Seen"]
    outcome = await execute(
        command("query", {"describe": describe}), h.context(own_namespace="default")
    )
    result = _result(outcome)
    assert (result["events"], result["excludedNamespace"]) == ([], "default")
