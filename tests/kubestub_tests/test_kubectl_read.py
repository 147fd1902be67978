"""kubectl reads from the stand-in: version, discovery, tables, JSON, selectors, paging."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kubestub import KubeStub, StubSettings

from .kubectl import Kubectl


async def test_version_reports_a_1_32_server_without_skew_warning(kubectl: Kubectl) -> None:
    result = await kubectl.run("version")
    assert result.returncode == 0
    assert "Server Version: v1.32.0-kubestub" in result.stdout
    assert result.stderr == ""


async def test_api_resources_come_from_aggregated_discovery(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    result = await kubectl.run("api-resources")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert {"pods", "services", "configmaps", "secrets", "events", "namespaces"} <= rows.keys()
    assert "apps/v1" in rows["deployments"]
    assert "batch/v1" in rows["jobs"]
    assert "po " in rows["pods"]
    assert rows["namespaces"].split()[-2] == "false"
    # Two discovery requests (/api and /apis, aggregated), no per-group-version round trips.
    paths = [entry.path for entry in stub.requests]
    assert "/api" in paths
    assert "/apis" in paths
    assert "/api/v1" not in paths
    assert "/apis/apps/v1" not in paths


async def test_kubectl_falls_back_to_legacy_discovery_quietly(tmp_path: Path) -> None:
    async with KubeStub(settings=StubSettings(aggregated_discovery=False)) as stub:
        stub.add_pod("demo")
        home = tmp_path / "home"
        home.mkdir()
        kubectl = Kubectl(stub.write_kubeconfig(tmp_path / "kubeconfig"), home, tmp_path)
        result = await kubectl.run("get", "deployments,pods", "-o", "name")
        paths = [entry.path for entry in stub.requests]
    assert (result.returncode, result.stdout, result.stderr) == (0, "pod/demo\n", "")
    assert "/apis/apps/v1" in paths
    assert "/api/v1" in paths


async def test_get_pods_all_namespaces_prints_the_server_table(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    stub.add_pod("other", namespace="kube-system")
    result = await kubectl.run("get", "pods", "-A")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1].split()[:5] == ["default", "demo", "1/1", "Running", "0"]
    assert lines[2].split()[:2] == ["kube-system", "other"]
    table_requests = [
        e
        for e in stub.requests
        if e.path == "/api/v1/pods" and "as=Table" in (e.header("Accept") or "")
    ]
    assert table_requests


async def test_get_wide_and_other_kinds_print_their_columns(kubectl: Kubectl) -> None:
    wide = await kubectl.run("get", "pod", "demo", "-o", "wide")
    assert wide.stdout.split("\n")[0].split()[5:8] == ["IP", "NODE", "NOMINATED"]
    services = await kubectl.run("get", "svc")
    assert services.stdout.splitlines()[0].split() == [
        "NAME",
        "TYPE",
        "CLUSTER-IP",
        "EXTERNAL-IP",
        "PORT(S)",
        "AGE",
    ]
    assert services.stdout.splitlines()[1].split()[:5] == [
        "kubernetes",
        "ClusterIP",
        "10.96.0.1",
        "<none>",
        "443/TCP",
    ]


async def test_get_pod_json_is_the_stored_object(kubectl: Kubectl, stub: KubeStub) -> None:
    result = await kubectl.run("get", "pod", "demo", "-o", "json")
    assert result.returncode == 0, result.stderr
    pod = json.loads(result.stdout)
    stored = stub.get("v1", "Pod", "demo", "default")
    assert stored is not None
    assert pod["metadata"]["uid"] == stored["metadata"]["uid"]
    assert pod["status"]["phase"] == "Running"
    assert pod["kind"] == "Pod"
    assert pod["apiVersion"] == "v1"


async def test_label_and_field_selectors_filter(kubectl: Kubectl, stub: KubeStub) -> None:
    stub.add_pod("web")
    by_label = await kubectl.run("get", "pods", "-l", "app=web", "-o", "name")
    assert by_label.stdout.split() == ["pod/web"]
    by_field = await kubectl.run(
        "get", "pods", "-A", "--field-selector", "metadata.name=demo", "-o", "name"
    )
    assert by_field.stdout.split() == ["pod/demo"]
    bad = await kubectl.run("get", "pods", "--field-selector", "spec.bogus=1")
    assert bad.returncode == 1
    assert "field label not supported: spec.bogus" in bad.stderr


async def test_chunked_list_pages_with_limit_and_continue(kubectl: Kubectl, stub: KubeStub) -> None:
    for name in ("a", "b", "c"):
        stub.add_pod(name)
    result = await kubectl.run("get", "pods", "--chunk-size=2", "-o", "name")
    assert result.stdout.split() == ["pod/a", "pod/b", "pod/c", "pod/demo"]
    pages = [e for e in stub.requests if e.path == "/api/v1/namespaces/default/pods"]
    assert len(pages) == 2
    assert "continue=" in pages[1].query_string


async def test_missing_pod_is_the_servers_not_found(kubectl: Kubectl) -> None:
    result = await kubectl.run("get", "pod", "x")
    assert result.returncode == 1
    assert result.stderr.strip() == 'Error from server (NotFound): pods "x" not found'


async def test_describe_pod_reads_it_and_its_events(kubectl: Kubectl) -> None:
    result = await kubectl.run("describe", "pod", "demo")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "Status:           Running" in result.stdout
    assert "Node:             stub-node/10.0.0.10" in result.stdout
