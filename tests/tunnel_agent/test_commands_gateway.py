"""The commands' gateway: helm's way to the API server, never with the agent's credentials."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.fakebin.support import Harness, harness
from tests.support import until
from tunnel_agent.executors import gateway
from tunnel_agent.executors.gateway import MAX_REQUEST_BODY, CommandsGateway, TofuState, refusal
from tunnel_agent.identity import RunIdentity
from tunnel_agent.kubeapi import KubeApi

OWN = "tunnel-agent"


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        for name in (OWN, "web"):
            running.stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        running.add_secret(OWN, "agent-credentials", {"tls.key": "the agent's key"})
        running.add_secret("web", "db", {"password": "app"})
        yield running


class Helm:
    """What a helm process holds: the gateway's URL and its token, from its kubeconfig."""

    def __init__(self, kubeconfig: Path, http: aiohttp.ClientSession) -> None:
        config = json.loads(kubeconfig.read_text())
        self.server = config["clusters"][0]["cluster"]["server"]
        self.token = config["users"][0]["user"]["token"]
        self.http = http

    def watch(self, path: str) -> Any:
        """``async with helm.watch(path) as response``: a GET whose answer streams."""
        return self.http.get(self.server + path, headers={"Authorization": f"Bearer {self.token}"})

    async def call(
        self, method: str, path: str, *, token: str | None = None, **options: Any
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"}
        headers |= options.pop("headers", {})
        async with self.http.request(
            method, self.server + path, headers=headers, **options
        ) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None


async def test_helm_reads_and_writes_outside_the_agents_namespace(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with h.gateway.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig:
        assert kubeconfig.stat().st_mode & 0o077 == 0
        helm = Helm(kubeconfig, http)
        status, secret = await helm.call("GET", "/api/v1/namespaces/web/secrets/db")
        assert status == 200
        assert secret["metadata"]["name"] == "db"
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": "web"},
            "data": {"a": "1"},
        }
        status, created = await helm.call(
            "POST", "/api/v1/namespaces/web/configmaps", json=config_map
        )
        assert status == 201, created
        assert h.stub.get("v1", "ConfigMap", "settings", "web") is not None
        status, discovery = await helm.call("GET", "/api")
        assert (status, discovery["kind"]) == (200, "APIVersions")
    # The API server saw the agent's credentials, never the gateway's token.
    seen = [dict(entry.headers).get("Authorization") for entry in h.stub.requests]
    assert seen
    assert set(seen) == {f"Bearer {h.stub.token}"}


async def test_the_agents_namespace_is_out_of_reach(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with h.gateway.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig:
        helm = Helm(kubeconfig, http)
        for method, path in [
            ("GET", f"/api/v1/namespaces/{OWN}/secrets/agent-credentials"),
            ("GET", f"/api/v1/namespaces/{OWN}/secrets"),
            ("POST", f"/api/v1/namespaces/{OWN}/configmaps"),
            ("DELETE", f"/api/v1/namespaces/{OWN}"),
            ("GET", f"/apis/apps/v1/namespaces/{OWN}/deployments?watch=1"),
        ]:
            status, answer = await helm.call(method, path)
            assert status == 403, (method, path)
            assert answer["kind"] == "Status"
            assert f"namespace {OWN} is the agent's own" in answer["message"]
        status, answer = await helm.call("GET", "/api/v1/secrets")
        assert status == 403
        assert "Secrets across every namespace" in answer["message"]
    assert not [entry for entry in h.stub.requests if OWN in entry.path or "secrets" in entry.path]


async def test_a_token_works_only_while_its_block_runs(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with h.gateway.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig:
        helm = Helm(kubeconfig, http)
        assert (await helm.call("GET", "/api/v1/namespaces/web/configmaps"))[0] == 200
        assert (await helm.call("GET", "/api/v1/namespaces", token="forged"))[0] == 401
        assert (await helm.call("GET", "/api/v1/namespaces", token=""))[0] == 401
        assert h.gateway.grants == 1
    assert not kubeconfig.exists()
    assert h.gateway.grants == 0
    status, answer = await helm.call("GET", "/api/v1/namespaces")
    assert status == 401
    assert answer["reason"] == "Unauthorized"


async def test_impersonation_and_connections_into_pods_are_refused(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    h.stub.add_pod("app", "web")
    async with h.gateway.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig:
        helm = Helm(kubeconfig, http)
        status, answer = await helm.call(
            "GET", "/api/v1/namespaces", headers={"Impersonate-User": "system:admin"}
        )
        assert (status, answer["reason"]) == (403, "Forbidden")
        status, _ = await helm.call("POST", "/api/v1/namespaces/web/pods/app/exec?command=id")
        assert status == 403
        status, _ = await helm.call("GET", "/api/v1/namespaces/web/secrets%2Fdb")
        assert status == 403
    assert not [entry for entry in h.stub.requests if "exec" in entry.path]


async def test_a_body_over_the_bound_is_refused_unread(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with h.gateway.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig:
        helm = Helm(kubeconfig, http)
        status, answer = await helm.call(
            "POST",
            "/api/v1/namespaces/web/configmaps",
            data=io.BytesIO(b"x" * (MAX_REQUEST_BODY + 1)),
        )
    assert (status, answer["reason"]) == (413, "RequestEntityTooLarge")


async def test_a_watch_streams_its_events_as_they_happen(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with h.gateway.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig:
        helm = Helm(kubeconfig, http)
        async with helm.watch("/api/v1/namespaces/web/configmaps?watch=1") as response:
            assert response.status == 200
            h.stub.add(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "late", "namespace": "web"},
                }
            )
            line = await asyncio.wait_for(response.content.readline(), 10)
            event = json.loads(line)
            assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "late")
            assert h.stub.store.watcher_count == 1
        # helm left: the gateway's watch on the API server ends with it, at once.
        await until(lambda: h.stub.store.watcher_count == 0, max_turns=10**6)


@pytest.mark.parametrize(
    ("method", "target", "headers", "refused"),
    [
        ("GET", "/api/v1/namespaces/web/pods", {}, None),
        ("GET", "/version", {}, None),
        ("GET", "/openapi/v2", {}, None),
        ("POST", "/version", {}, "is not an API resource"),
        ("GET", f"/api/v1/namespaces/{OWN}", {}, "the agent's own"),
        ("GET", f"/api/v1/watch/namespaces/{OWN}/secrets", {}, "the agent's own"),
        ("GET", "/api/v1/watch/secrets", {}, "across every namespace"),
        ("GET", "/api/v1/secrets?watch=true", {}, "across every namespace"),
        ("GET", "/api/v1/namespaces/web/pods/x/log", {}, None),
        ("GET", "/api/v1/namespaces/web/pods/x/portforward", {}, "no connection"),
        ("GET", "/api/v1/nodes/n/proxy/metrics", {}, "no connection"),
        ("GET", "/api/v1/proxy/namespaces/web/pods/x/metrics", {}, "no connection"),
        ("GET", "/api/v1/namespaces", {"Connection": "Upgrade"}, "no connection"),
        ("GET", "/api/v1/namespaces", {"impersonate-group": "x"}, "impersonate"),
        ("GET", "/api/v1/namespaces/web/../tunnel-agent/secrets", {}, "dot or encoded"),
        ("GET", "relative", {}, "dot or encoded"),
    ],
)
def test_the_rule_a_commands_request_keeps(
    method: str, target: str, headers: dict[str, str], refused: str | None
) -> None:
    why = refusal(method, target, headers, OWN)
    if refused is None:
        assert why is None
    else:
        assert why is not None
        assert refused in why


def test_without_an_own_namespace_only_the_rest_of_the_rule_applies() -> None:
    assert refusal("GET", f"/api/v1/namespaces/{OWN}/secrets/x", {}, None) is None
    assert refusal("GET", "/api/v1/secrets", {}, None) is not None


async def test_requests_in_progress_end_with_their_kubeconfig(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A child that outlives helm with its socket cannot keep a watch the token no longer allows."""
    async with h.gateway.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig:
        helm = Helm(kubeconfig, http)
        watch = await helm.watch("/api/v1/namespaces/web/configmaps?watch=1")
        assert watch.status == 200
        await until(lambda: h.stub.store.watcher_count == 1, max_turns=10**6)
    try:
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(watch.content.read(), 10)
    finally:
        watch.release()
    await until(lambda: h.stub.store.watcher_count == 0, max_turns=10**6)


async def test_requests_in_progress_are_bounded_per_process(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway, "MAX_REQUESTS_PER_PROCESS", 1)
    async with h.gateway.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig:
        helm = Helm(kubeconfig, http)
        async with helm.watch("/api/v1/namespaces/web/configmaps?watch=1") as watch:
            assert watch.status == 200
            status, answer = await helm.call("GET", "/api/v1/namespaces/web/configmaps")
            assert (status, answer["reason"]) == (429, "TooManyRequests")
        await until(lambda: h.stub.store.watcher_count == 0, max_turns=10**6)
        assert (await helm.call("GET", "/api/v1/namespaces/web/configmaps"))[0] == 200


class _Configuration(SimpleNamespace):
    """The part of a kubernetes_asyncio Configuration that KubeApi reads."""

    async def auth_settings(self) -> dict[str, Any]:
        return {"BearerToken": {"value": "Bearer the-agents-token"}}


async def test_an_answer_that_breaks_off_reaches_helm_broken_not_complete(tmp_path: Path) -> None:
    async def breaks_off(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b'{"kind":"List","items":[')
        assert request.transport is not None
        request.transport.close()  # the API server restarts mid-answer
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", breaks_off)
    upstream = web.AppRunner(app, access_log=None)
    await upstream.setup()
    await web.TCPSite(upstream, "127.0.0.1", 0).start()
    port = upstream.addresses[0][1]
    kube = KubeApi(
        _Configuration(
            host=f"http://127.0.0.1:{port}",
            verify_ssl=True,
            ssl_ca_cert=None,
            cert_file=None,
            key_file=None,
        )
    )
    gateway_ = CommandsGateway(kube)
    try:
        async with (
            gateway_.kubeconfig(tmp_path, own_namespace=OWN, label="test") as kubeconfig,
            aiohttp.ClientSession() as http,
        ):
            helm = Helm(kubeconfig, http)
            async with helm.watch("/api/v1/namespaces/web/configmaps") as response:
                assert response.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(response.read(), 10)
    finally:
        await gateway_.close()
        await kube.close()
        await upstream.cleanup()


ALICE = RunIdentity("tunnel:alice", ("tunnel:dev", "tunnel:ops"))


async def test_a_credential_acts_as_its_runs_identity_and_no_other(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    h.stub.deny("tunnel:alice", "get", "secrets", namespace="web")
    async with h.gateway.kubeconfig(
        tmp_path, own_namespace=OWN, label="test", identity=ALICE
    ) as kubeconfig:
        helm = Helm(kubeconfig, http)
        assert (await helm.call("GET", "/api/v1/namespaces/web/configmaps"))[0] == 200
        status, refused = await helm.call("GET", "/api/v1/namespaces/web/secrets/db")
        assert status == 403
        assert 'User "tunnel:alice" cannot get resource "secrets"' in refused["message"]
        for header in ("Impersonate-User", "Impersonate-Group", "Impersonate_User"):
            status, refused = await helm.call(
                "GET", "/api/v1/namespaces/web/configmaps", headers={header: "tunnel:bob"}
            )
            assert status == 403, header
            assert "may not impersonate anyone" in refused["message"]
    seen = [entry for entry in h.stub.requests if entry.path.startswith("/api/v1/namespaces/web")]
    assert len(seen) == 2
    for entry in seen:
        assert entry.header_values("Impersonate-User") == ["tunnel:alice"]
        assert entry.header_values("Impersonate-Group") == ["tunnel:dev", "tunnel:ops"]
        assert entry.header("Authorization") == f"Bearer {h.stub.token}"


async def test_a_credential_stops_working_at_its_expiry(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    expires = asyncio.get_running_loop().time() + 3600
    async with h.gateway.kubeconfig(
        tmp_path, own_namespace=OWN, label="test", identity=ALICE, expires=expires
    ) as kubeconfig:
        helm = Helm(kubeconfig, http)
        assert (await helm.call("GET", "/api/v1/namespaces/web/configmaps"))[0] == 200
    async with h.gateway.kubeconfig(
        tmp_path, own_namespace=OWN, label="test", identity=ALICE, expires=0.0
    ) as kubeconfig:
        helm = Helm(kubeconfig, http)
        status, answer = await helm.call("GET", "/api/v1/namespaces/web/configmaps")
        assert status == 401
        assert answer["reason"] == "Unauthorized"


async def test_a_runs_tofu_state_in_the_agents_namespace_is_all_it_reaches_there(
    h: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    state = TofuState(OWN, "web")
    async with h.gateway.kubeconfig(
        tmp_path, own_namespace=OWN, label="test", identity=ALICE, tofu_state=state
    ) as kubeconfig:
        helm = Helm(kubeconfig, http)
        secrets = f"/api/v1/namespaces/{OWN}/secrets"
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tfstate-default-web"}}
        status, created = await helm.call("POST", secrets, json=body)
        assert status == 201, created
        assert (await helm.call("GET", f"{secrets}/tfstate-default-web"))[0] == 200
        selector = "labelSelector=tfstate%3Dtrue%2CtfstateSecretSuffix%3Dweb"
        assert (await helm.call("GET", f"{secrets}?{selector}"))[0] == 200
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
        status, _ = await helm.call(
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{OWN}/leases",
            json=lease | {"metadata": {"name": "lock-tfstate-default-web"}},
        )
        assert status == 201
        for method, path, sent in [
            ("GET", f"{secrets}/agent-credentials", None),
            ("GET", f"{secrets}/tfstate-default-other", None),
            ("GET", secrets, None),
            ("GET", f"{secrets}?labelSelector=tfstate%3Dtrue", None),
            ("POST", secrets, body | {"metadata": {"name": "agent-token"}}),
            ("POST", secrets, body | {"type": "kubernetes.io/service-account-token"}),
            ("GET", f"/api/v1/namespaces/{OWN}/configmaps", None),
        ]:
            status, answer = await helm.call(method, path, json=sent)
            assert status == 403, (method, path, sent)
            assert f"namespace {OWN} is the agent's own" in answer["message"]
    # The state is the agent's record: kept as the agent, not as alice.
    kept = [entry for entry in h.stub.requests if OWN in entry.path]
    assert len(kept) == 4
    assert all(entry.header("Impersonate-User") is None for entry in kept)
    secret = h.stub.get("v1", "Secret", "tfstate-default-web", OWN)
    assert secret is not None
