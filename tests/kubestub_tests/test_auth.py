"""Authentication, impersonation and access reviews, seen through kubectl and the request log."""

from __future__ import annotations

from tests.kubestub import KubeStub

from .kubectl import Kubectl


async def test_can_i_answers_for_the_impersonated_user(kubectl: Kubectl, stub: KubeStub) -> None:
    stub.deny("alice", "delete", "pods")
    denied = await kubectl.run("auth", "can-i", "delete", "pods", "--as", "alice")
    assert (denied.returncode, denied.stdout) == (1, "no\n")
    allowed = await kubectl.run("auth", "can-i", "get", "pods", "--as", "alice")
    assert (allowed.returncode, allowed.stdout, allowed.stderr) == (0, "yes\n", "")
    other = await kubectl.run("auth", "can-i", "delete", "pods", "--as", "bob")
    assert (other.returncode, other.stdout) == (0, "yes\n")
    review = next(e for e in stub.requests if e.path.endswith("/selfsubjectaccessreviews"))
    assert review.header("Impersonate-User") == "alice"
    assert review.user is not None
    assert review.user.name == "alice"


async def test_can_i_checks_subresources(kubectl: Kubectl, stub: KubeStub) -> None:
    stub.deny("carol", "create", "pods/exec")
    exec_ = await kubectl.run(
        "auth", "can-i", "create", "pods", "--subresource=exec", "--as", "carol"
    )
    assert exec_.stdout == "no\n"
    # "pods/exec" is TYPE/NAME to kubectl: the pod named "exec", which carol may create.
    named = await kubectl.run("auth", "can-i", "create", "pods/exec", "--as", "carol")
    assert named.stdout == "yes\n"
    log = await kubectl.run("auth", "can-i", "get", "pods", "--subresource=log", "--as", "carol")
    assert log.stdout == "yes\n"


async def test_a_denied_exec_is_forbidden_before_any_upgrade(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    stub.deny("carol", "create", "pods/exec")
    result = await kubectl.run("exec", "demo", "--as", "carol", "--", "echo", "hi")
    assert result.returncode == 1
    assert (
        'pods "demo" is forbidden: User "carol" cannot create resource "pods/exec" in API group ""'
        in result.stderr
    )


async def test_whoami_reports_the_impersonated_user_and_groups(kubectl: Kubectl) -> None:
    result = await kubectl.run("auth", "whoami", "--as", "bob", "--as-group", "devs")
    assert result.returncode == 0, result.stderr
    rows = [line.split(None, 1) for line in result.stdout.splitlines()]
    assert rows == [
        ["ATTRIBUTE", "VALUE"],
        ["Username", "bob"],
        ["Groups", "[devs system:authenticated]"],
    ]


async def test_request_log_keeps_every_header_as_received(kubectl: Kubectl, stub: KubeStub) -> None:
    result = await kubectl.run(
        "get", "pods", "--as", "alice", "--as-group", "devs", "--as-group", "ops"
    )
    assert result.returncode == 0, result.stderr
    entry = next(e for e in stub.requests if e.path == "/api/v1/namespaces/default/pods")
    assert entry.header("Authorization") == f"Bearer {stub.token}"
    assert entry.header("impersonate-user") == "alice"
    assert entry.header_values("Impersonate-Group") == ["devs", "ops"]
    assert entry.user is not None
    assert entry.user.groups == ("devs", "ops", "system:authenticated")
    assert entry.status == 200


async def test_impersonation_needs_the_impersonate_permission(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    stub.deny("kubestub-admin", "impersonate", "users", name="root")
    # Discovery first, as the admin: kubectl caches it, so the next request is the pods list.
    assert (await kubectl.run("get", "pods")).returncode == 0
    result = await kubectl.run("get", "pods", "--as", "root")
    assert result.returncode == 1
    assert (
        'users "root" is forbidden: User "kubestub-admin" cannot impersonate resource "users" '
        'in API group "" at the cluster scope'
    ) in result.stderr


async def test_a_second_token_authenticates_as_its_own_user(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    token = stub.add_token("dave", ("team-a", "system:authenticated"))
    kubectl.kubeconfig.write_text(stub.kubeconfig(token=token))
    result = await kubectl.run("auth", "whoami")
    assert result.returncode == 0, result.stderr
    assert "dave" in result.stdout
    assert "team-a" in result.stdout
