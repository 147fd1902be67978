"""Secret values stay in the cluster, whatever the caller asks for (the real kubectl).

The agent runs without --allow-secret-values (the default): Secrets can be
listed by name, and every request whose answer could carry a value is refused
or narrowed before it reaches the API server.
"""

from __future__ import annotations

import base64
import json
from urllib.parse import parse_qsl

import pytest

from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel

from ..support import until
from ..tunnel_server.frontdoor_support import PREFIX, caller, get

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel

VALUE = "hunter2-in-the-cluster"
ENCODED = base64.b64encode(VALUE.encode()).decode()
SECRETS = f"{PREFIX}/api/v1/namespaces/default/secrets"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


@pytest.fixture
def secret(tunnel: Tunnel) -> None:
    """A Secret as ``kubectl apply`` leaves it: its value in the data and in an annotation."""
    applied = {"apiVersion": "v1", "kind": "Secret", "data": {"password": ENCODED}}
    tunnel.stub.add(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "db",
                "namespace": "default",
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied)
                },
            },
            "data": {"password": ENCODED},
        }
    )


def carries_the_value(text: str | bytes) -> bool:
    data = text.encode() if isinstance(text, str) else text
    return ENCODED.encode() in data or VALUE.encode() in data


@pytest.mark.usefixtures("secret")
async def test_kubectl_get_secrets_lists_their_names_and_nothing_else(tunnel: Tunnel) -> None:
    result = await tunnel.kubectl.run("get", "secrets", "-o", "wide")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[0] == "db"
    [asked] = [r for r in tunnel.stub.requests if r.path.endswith("/namespaces/default/secrets")]
    # What reached the API server: a Table and nothing it could answer otherwise.
    assert ("includeObject", "None") in parse_qsl(asked.query_string)
    accept = [value for name, value in asked.headers if name.lower() == "accept"]
    assert accept == [f"{TABLE},application/json;as=Table;v=v1beta1;g=meta.k8s.io"]


@pytest.mark.usefixtures("secret")
async def test_kubectl_get_secrets_watch_streams_names_as_they_come(tunnel: Tunnel) -> None:
    watch = await tunnel.kubectl.start("get", "secrets", "-w", "--no-headers")
    try:
        assert (await watch.line()).split()[0] == "db"
        await until(lambda: tunnel.stub.store.watcher_count >= 1, max_turns=10**7)
        tunnel.stub.add(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "later", "namespace": "default"},
                "data": {"token": ENCODED},
            }
        )
        later = await watch.line()
        assert later.split()[0] == "later"
        assert not carries_the_value(later)
    finally:
        stderr = await watch.stop()
    assert not carries_the_value(stderr)


@pytest.mark.usefixtures("secret")
@pytest.mark.parametrize(
    "args",
    [
        ("get", "secret", "db", "-o", "yaml"),
        ("get", "secret", "db", "-o", "jsonpath={.data.password}"),
        ("get", "secrets", "--sort-by=.metadata.name"),
        ("get", "secrets", "-o", "name"),
        ("delete", "secret", "db"),
        ("annotate", "secret", "db", "x=y"),
        ("create", "secret", "generic", "other", "--from-literal=k=v"),
    ],
)
async def test_every_kubectl_command_whose_answer_carries_values_is_refused(
    tunnel: Tunnel, args: tuple[str, ...]
) -> None:
    result = await tunnel.kubectl.run(*args)
    assert result.returncode != 0, result.stdout
    assert "--allow-secret-values" in result.stderr
    assert not carries_the_value(result.stdout + result.stderr)
    stored = tunnel.stub.get("v1", "Secret", "db", "default")
    assert stored is not None  # not deleted
    assert stored["data"] == {"password": ENCODED}  # nor changed


@pytest.mark.usefixtures("secret")
async def test_server_side_apply_of_a_secret_is_refused_as_it_would_return_the_values(
    tunnel: Tunnel,
) -> None:
    manifest = b"apiVersion: v1\nkind: Secret\nmetadata: {name: db, namespace: default}\n"
    result = await tunnel.kubectl.run("apply", "--server-side", "-f", "-", stdin=manifest)
    assert result.returncode != 0
    assert "--allow-secret-values" in result.stderr
    assert not carries_the_value(result.stdout + result.stderr)


@pytest.mark.usefixtures("secret")
@pytest.mark.parametrize(
    ("target", "accept"),
    [
        # A range the API server reads as JSON, ahead of a decoy "as=Table".
        (f"{SECRETS}/db", "application/json, text/x;as=Table"),
        (f"{SECRETS}/db", "application/json;x=as=Table"),
        (f"{SECRETS}?includeObject=Object", TABLE),
        (f"{SECRETS}?include%4Fbject=Object", TABLE),
    ],
)
async def test_a_raw_request_dressed_up_as_a_table_gets_no_value(
    tunnel: Tunnel, target: str, accept: str
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, target, f"Accept: {accept}"))
        reply = await connection.reply()
    assert reply.status == 403
    assert "--allow-secret-values" in reply.json()["message"]
    assert not carries_the_value(reply.body)


@pytest.mark.usefixtures("secret")
async def test_a_table_of_secrets_carries_not_even_their_annotations(tunnel: Tunnel) -> None:
    """The last-applied-configuration annotation holds what kubectl apply sent: values."""
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{SECRETS}?includeObject=Metadata", f"Accept: {TABLE}"))
        reply = await connection.reply()
    assert reply.status == 200
    table = reply.json()
    assert table["kind"] == "Table"
    assert [row["cells"][0] for row in table["rows"]] == ["db"]
    assert not carries_the_value(reply.body)


@pytest.mark.usefixtures("secret")
async def test_the_agents_refusal_of_a_discovery_shaped_request_is_plain_text(
    tunnel: Tunnel,
) -> None:
    """The agent writes its refusals as the server does: plain text where client-go needs it."""
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{SECRETS}/db", f"Accept: {accept}"))
        reply = await connection.reply()
    assert reply.status == 403
    assert reply.header("content-type") == "text/plain; charset=utf-8"
    assert reply.body.startswith(b"Secret values are not served through this tunnel")
