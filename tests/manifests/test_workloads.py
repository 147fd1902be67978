"""The agent's and the server's Deployments: one replica, locked down, probed, sized."""

from __future__ import annotations

import pytest

from .support import (
    USER_MANIFESTS,
    VARIANTS,
    AgentValues,
    Object,
    built,
    containers,
    find,
    render,
)

VALUES = AgentValues()


def _agent_objects(variant: str) -> list[Object]:
    return render(variant, VALUES.for_variant(variant))


def _deployments() -> list[tuple[str, Object]]:
    found = [
        (f"agent {variant}", find(_agent_objects(variant), "Deployment", "tunnel-agent"))
        for variant in VARIANTS
    ]
    found.append(("server", find(built(USER_MANIFESTS / "server"), "Deployment", "tunnel-server")))
    return found


DEPLOYMENTS = _deployments()
IDS = [name for name, _ in DEPLOYMENTS]


@pytest.mark.parametrize(("name", "deployment"), DEPLOYMENTS, ids=IDS)
def test_one_replica_replaced_by_recreate(name: str, deployment: Object) -> None:
    """Two agents of one cluster (or two servers on one SQLite volume) must never overlap."""
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(("name", "deployment"), DEPLOYMENTS, ids=IDS)
def test_the_pod_runs_locked_down(name: str, deployment: Object) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in containers(deployment):
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["privileged"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize(("name", "deployment"), DEPLOYMENTS, ids=IDS)
def test_tmp_is_a_writable_empty_dir(name: str, deployment: Object) -> None:
    """The root file system is read-only; /tmp (HOME and command work dirs) is an emptyDir."""
    pod = deployment["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    [container] = containers(deployment)
    [tmp] = [mount for mount in container["volumeMounts"] if mount["mountPath"] == "/tmp"]
    assert "emptyDir" in volumes[tmp["name"]]
    assert volumes[tmp["name"]]["emptyDir"]["sizeLimit"]


@pytest.mark.parametrize(("name", "deployment"), DEPLOYMENTS, ids=IDS)
def test_requests_and_a_memory_limit_are_set(name: str, deployment: Object) -> None:
    [container] = containers(deployment)
    resources = container["resources"]
    assert resources["requests"]["cpu"]
    assert resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    # No CPU limit: bursts (a burst of kubectl requests) are not throttled.
    assert "cpu" not in resources["limits"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_agent_probes_its_health_port(variant: str) -> None:
    deployment = find(_agent_objects(variant), "Deployment", "tunnel-agent")
    [agent] = containers(deployment)
    env = {variable["name"]: variable.get("value") for variable in agent["env"]}
    assert env["TUNNEL_AGENT_HEALTH_LISTEN"] == "0.0.0.0:8081"
    assert agent["ports"] == [
        {"name": "health", "containerPort": 8081, "protocol": "TCP"},
        {"name": "gateway", "containerPort": 8444, "protocol": "TCP"},
    ]
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert agent["args"] == ["run"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_agent_uses_its_service_account_token(variant: str) -> None:
    pod = find(_agent_objects(variant), "Deployment", "tunnel-agent")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "tunnel-agent"
    assert pod["automountServiceAccountToken"] is True
    [agent] = pod["containers"]
    env = {variable["name"] for variable in agent["env"]}
    assert "TUNNEL_AGENT_KUBECONFIG" not in env  # in-cluster configuration


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_agent_reads_what_the_bootstrap_secret_holds(variant: str) -> None:
    """Every key the Deployment takes from the bootstrap Secret, as env or file, exists."""
    objects = _agent_objects(variant)
    secret = find(objects, "Secret", "tunnel-agent-bootstrap")
    pod = find(objects, "Deployment", "tunnel-agent")["spec"]["template"]["spec"]
    [agent] = pod["containers"]
    for variable in agent["env"]:
        reference = variable.get("valueFrom", {}).get("secretKeyRef")
        if reference is not None:
            assert reference["name"] == "tunnel-agent-bootstrap"
            assert reference["key"] in secret["stringData"]
    [volume] = [volume for volume in pod["volumes"] if "secret" in volume]
    assert volume["secret"]["secretName"] == "tunnel-agent-bootstrap"
    [mount] = [mount for mount in agent["volumeMounts"] if mount["name"] == volume["name"]]
    assert mount["readOnly"] is True
    env = {variable["name"]: variable.get("value") for variable in agent["env"]}
    for variable in ("TUNNEL_AGENT_CA", "TUNNEL_AGENT_BOOTSTRAP_TOKEN_FILE"):
        directory, _, key = env[variable].rpartition("/")
        assert directory == mount["mountPath"]
        assert key in secret["stringData"]


def test_the_server_probes_its_tls_port_over_https() -> None:
    deployment = find(built(USER_MANIFESTS / "server"), "Deployment", "tunnel-server")
    [server] = containers(deployment)
    env = {variable["name"]: variable.get("value") for variable in server["env"]}
    assert env["TUNNEL_SERVER_LISTEN"] == "0.0.0.0:8443"
    assert server["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    assert server["livenessProbe"]["httpGet"] == {
        "scheme": "HTTPS",
        "path": "/healthz",
        "port": "https",
    }
    assert server["readinessProbe"]["httpGet"] == {
        "scheme": "HTTPS",
        "path": "/readyz",
        "port": "https",
    }
    assert server["args"] == ["serve"]


def test_the_server_keeps_its_state_on_the_claimed_volume() -> None:
    objects = built(USER_MANIFESTS / "server")
    claim = find(objects, "PersistentVolumeClaim", "tunnel-server-state")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    pod = find(objects, "Deployment", "tunnel-server")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["fsGroup"] == 65532
    [server] = pod["containers"]
    env = {variable["name"]: variable.get("value") for variable in server["env"]}
    [volume] = [volume for volume in pod["volumes"] if "persistentVolumeClaim" in volume]
    assert volume["persistentVolumeClaim"]["claimName"] == "tunnel-server-state"
    [mount] = [mount for mount in server["volumeMounts"] if mount["name"] == volume["name"]]
    assert mount["mountPath"] == env["TUNNEL_SERVER_STATE_DIR"]


def test_the_server_service_publishes_the_tls_port_as_plain_tcp() -> None:
    """TLS passes through the load balancer: a TCP port, targeting the server's TLS port."""
    objects = built(USER_MANIFESTS / "server")
    service = find(objects, "Service", "tunnel-server")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    template = find(objects, "Deployment", "tunnel-server")["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()


def test_the_server_image_tag_is_set_by_the_user_kustomization() -> None:
    deployment = find(built(USER_MANIFESTS / "server"), "Deployment", "tunnel-server")
    [server] = containers(deployment)
    assert server["image"] == "ghcr.io/example/tunnel-server:0.1.0"


@pytest.mark.parametrize("variant", VARIANTS)
def test_runs_jobs_are_of_the_agents_own_image_and_reach_its_gateway(variant: str) -> None:
    deployment = find(_agent_objects(variant), "Deployment", "tunnel-agent")
    [agent] = containers(deployment)
    env = {variable["name"]: variable for variable in agent["env"]}
    assert env["TUNNEL_AGENT_RUN_IMAGE"]["value"] == agent["image"]
    assert env["TUNNEL_AGENT_GATEWAY_LISTEN"]["value"] == "0.0.0.0:8444"
