"""kubectl writes against the stand-in: apply (client- and server-side), create, delete, errors."""

from __future__ import annotations

from tests.kubestub import KubeStub

from .kubectl import Kubectl

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  mode: {mode}
"""

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
        ports:
        - containerPort: 80
"""


async def test_apply_creates_then_patches_then_leaves_unchanged(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    kubectl.write("cm.yaml", CONFIGMAP.format(mode="fast"))
    created = await kubectl.run("apply", "-f", "cm.yaml")
    assert (created.returncode, created.stdout, created.stderr) == (
        0,
        "configmap/settings created\n",
        "",
    )
    kubectl.write("cm.yaml", CONFIGMAP.format(mode="safe"))
    patched = await kubectl.run("apply", "-f", "cm.yaml")
    assert (patched.stdout, patched.stderr) == ("configmap/settings configured\n", "")
    again = await kubectl.run("apply", "-f", "cm.yaml")
    assert (again.stdout, again.stderr) == ("configmap/settings unchanged\n", "")
    stored = stub.get("v1", "ConfigMap", "settings", "default")
    assert stored is not None
    assert stored["data"] == {"mode": "safe"}
    patches = [e for e in stub.requests if e.method == "PATCH"]
    assert [e.header("Content-Type") for e in patches] == ["application/strategic-merge-patch+json"]


async def test_apply_of_a_deployment_merges_its_containers_by_name(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    kubectl.write("deploy.yaml", DEPLOYMENT.format(replicas=1))
    assert (await kubectl.run("apply", "-f", "deploy.yaml")).returncode == 0
    kubectl.write("deploy.yaml", DEPLOYMENT.format(replicas=2).replace("1.27", "1.28"))
    result = await kubectl.run("apply", "-f", "deploy.yaml")
    assert (result.stdout, result.stderr) == ("deployment.apps/web configured\n", "")
    stored = stub.get("apps/v1", "Deployment", "web", "default")
    assert stored is not None
    containers = stored["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [("nginx", "nginx:1.28")]
    assert stored["spec"]["replicas"] == 2
    assert stored["metadata"]["generation"] == 2
    rollout = await kubectl.run("rollout", "status", "deployment/web", "--timeout=10s")
    assert rollout.returncode == 0, rollout.stderr
    pods = await kubectl.run("get", "pods", "-l", "app=web", "-o", "name")
    assert len(pods.stdout.split()) == 2


async def test_server_side_apply_records_managed_fields_and_detects_conflicts(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    kubectl.write("deploy.yaml", DEPLOYMENT.format(replicas=1))
    applied = await kubectl.run("apply", "--server-side", "-f", "deploy.yaml")
    assert (applied.returncode, applied.stdout, applied.stderr) == (
        0,
        "deployment.apps/web serverside-applied\n",
        "",
    )
    stored = stub.get("apps/v1", "Deployment", "web", "default")
    assert stored is not None
    entries = stored["metadata"]["managedFields"]
    assert [(e["manager"], e["operation"]) for e in entries] == [("kubectl", "Apply")]
    assert "f:replicas" in entries[0]["fieldsV1"]["f:spec"]
    patched = await kubectl.run("patch", "deployment", "web", "-p", '{"spec":{"replicas":5}}')
    assert patched.returncode == 0, patched.stderr
    kubectl.write("deploy.yaml", DEPLOYMENT.format(replicas=2))
    conflict = await kubectl.run("apply", "--server-side", "-f", "deploy.yaml")
    assert conflict.returncode == 1
    assert (
        'Apply failed with 1 conflict: conflict with "kubectl-patch" using apps/v1: .spec.replicas'
        in conflict.stderr
    )
    forced = await kubectl.run("apply", "--server-side", "--force-conflicts", "-f", "deploy.yaml")
    assert forced.returncode == 0, forced.stderr
    stored = stub.get("apps/v1", "Deployment", "web", "default")
    assert stored is not None
    assert stored["spec"]["replicas"] == 2


async def test_delete_removes_the_object_and_waits_for_it(kubectl: Kubectl, stub: KubeStub) -> None:
    result = await kubectl.run("delete", "pod", "demo")
    assert (result.returncode, result.stdout, result.stderr) == (0, 'pod "demo" deleted\n', "")
    assert stub.get("v1", "Pod", "demo", "default") is None


async def test_create_of_an_existing_object_is_already_exists(kubectl: Kubectl) -> None:
    kubectl.write("cm.yaml", CONFIGMAP.format(mode="fast"))
    assert (await kubectl.run("create", "-f", "cm.yaml")).returncode == 0
    again = await kubectl.run("create", "-f", "cm.yaml")
    assert again.returncode == 1
    assert again.stderr.strip() == (
        'Error from server (AlreadyExists): error when creating "cm.yaml": '
        'configmaps "settings" already exists'
    )


async def test_typed_create_commands_send_protobuf_that_the_server_decodes(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    made = await kubectl.run("create", "configmap", "flags", "--from-literal=a=1")
    assert (made.stdout, made.stderr) == ("configmap/flags created\n", "")
    post = next(e for e in stub.requests if e.method == "POST")
    assert post.header("Content-Type") == "application/vnd.kubernetes.protobuf"
    stored = stub.get("v1", "ConfigMap", "flags", "default")
    assert stored is not None
    assert stored["data"] == {"a": "1"}
    again = await kubectl.run("create", "configmap", "flags", "--from-literal=a=1")
    assert again.stderr.strip() == (
        'error: failed to create configmap: configmaps "flags" already exists'
    )
    run = await kubectl.run("run", "box", "--image=busybox:1.36", "--env=A=1", "--", "sleep", "9")
    assert (run.stdout, run.stderr) == ("pod/box created\n", "")
    pod = stub.get("v1", "Pod", "box", "default")
    assert pod is not None
    container = pod["spec"]["containers"][0]
    assert (container["image"], container["args"], container["env"]) == (
        "busybox:1.36",
        ["sleep", "9"],
        [{"name": "A", "value": "1"}],
    )


async def test_scale_goes_through_the_scale_subresource(kubectl: Kubectl, stub: KubeStub) -> None:
    made = await kubectl.run("create", "deployment", "api", "--image=nginx", "--replicas=1")
    assert made.returncode == 0, made.stderr
    scaled = await kubectl.run("scale", "deployment", "api", "--replicas=3")
    assert (scaled.stdout, scaled.stderr) == ("deployment.apps/api scaled\n", "")
    stored = stub.get("apps/v1", "Deployment", "api", "default")
    assert stored is not None
    assert stored["spec"]["replicas"] == 3
    assert any(e.path.endswith("/deployments/api/scale") for e in stub.requests)


async def test_a_denied_request_is_the_servers_forbidden(kubectl: Kubectl, stub: KubeStub) -> None:
    stub.deny("alice", "get", "pods")
    result = await kubectl.run("get", "pod", "demo", "--as", "alice")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        'Error from server (Forbidden): pods "demo" is forbidden: User "alice" cannot get '
        'resource "pods" in API group "" in the namespace "default"'
    )
    allowed = await kubectl.run("get", "pod", "demo", "--as", "bob")
    assert allowed.returncode == 0


async def test_an_invalid_object_is_unprocessable(kubectl: Kubectl) -> None:
    kubectl.write(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: empty\nspec:\n  containers: []\n",
    )
    result = await kubectl.run("apply", "-f", "pod.yaml")
    assert result.returncode == 1
    assert result.stderr.strip() == ('The Pod "empty" is invalid: spec.containers: Required value')


async def test_a_wrong_token_is_unauthorized(kubectl: Kubectl, stub: KubeStub) -> None:
    kubectl.kubeconfig.write_text(stub.kubeconfig(token="not-a-token"))
    result = await kubectl.run("get", "pods")
    assert result.returncode == 1
    # What kubectl 1.32 prints for a 401 Status from discovery, as against a real cluster.
    assert result.stderr.splitlines()[-1] == (
        "error: You must be logged in to the server "
        "(the server has asked for the client to provide credentials)"
    )
    rejected = [e for e in stub.requests if e.status == 401]
    assert rejected
    assert all(e.user is None for e in rejected)
