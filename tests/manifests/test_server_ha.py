"""The server's HA variant: three replicas on PostgreSQL, spread, budgeted, draining."""

from __future__ import annotations

import yaml

from .support import USER_MANIFESTS, built, containers, find

OBJECTS = built(USER_MANIFESTS / "server-ha")
DEPLOYMENT = find(OBJECTS, "Deployment", "tunnel-server")
[SERVER] = containers(DEPLOYMENT)
ENV = {variable["name"]: variable for variable in SERVER["env"]}


def test_three_replicas_roll_one_at_a_time_and_a_budget_keeps_two() -> None:
    assert DEPLOYMENT["spec"]["replicas"] == 3
    strategy = DEPLOYMENT["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1},
    }
    budget = find(OBJECTS, "PodDisruptionBudget", "tunnel-server")
    assert budget["spec"]["maxUnavailable"] == 1


def test_replicas_spread_across_nodes() -> None:
    spread = DEPLOYMENT["spec"]["template"]["spec"]["topologySpreadConstraints"]
    by_key = {constraint["topologyKey"]: constraint for constraint in spread}
    assert by_key["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert "topology.kubernetes.io/zone" in by_key


def test_the_database_url_comes_from_a_secret_and_no_volume_is_claimed() -> None:
    assert ENV["TUNNEL_SERVER_DATABASE"]["valueFrom"]["secretKeyRef"] == {
        "name": "tunnel-postgres-app",
        "key": "uri",
    }
    assert "value" not in ENV["TUNNEL_SERVER_DATABASE"]
    assert not [obj for obj in OBJECTS if obj["kind"] == "PersistentVolumeClaim"]
    volumes = {
        volume["name"]: volume for volume in DEPLOYMENT["spec"]["template"]["spec"]["volumes"]
    }
    assert "persistentVolumeClaim" not in volumes["state"]
    assert volumes["ca"]["secret"]["secretName"] == "tunnel-server-ca"


def test_each_replica_is_named_for_its_pod_and_advertises_its_internal_port() -> None:
    assert (
        ENV["TUNNEL_SERVER_REPLICA_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    )
    assert ENV["TUNNEL_SERVER_ADVERTISE_ADDRESS"]["value"] == "$(POD_IP):8444"
    # $(POD_IP) expands only if POD_IP is defined before it.
    names = [variable["name"] for variable in SERVER["env"]]
    assert names.index("POD_IP") < names.index("TUNNEL_SERVER_ADVERTISE_ADDRESS")
    assert {"name": "peer", "containerPort": 8444, "protocol": "TCP"} in SERVER["ports"]


def test_only_replicas_reach_the_internal_port() -> None:
    policy = find(OBJECTS, "NetworkPolicy", "tunnel-server")
    [public, peers] = policy["spec"]["ingress"]
    assert public == {"ports": [{"port": "https", "protocol": "TCP"}]}
    assert peers["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "tunnel-server"}}}
    ]


def test_a_stopping_replica_drains_before_it_stops_and_is_unready_meanwhile() -> None:
    hook = SERVER["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python", "-c"]
    assert "SIGTERM" in hook[2]
    assert SERVER["readinessProbe"]["httpGet"]["path"] == "/readyz"
    grace = DEPLOYMENT["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > 30  # the server's shutdown grace, and the drain before it


def test_the_example_postgresql_is_a_cloudnativepg_cluster_whose_secret_the_server_reads() -> None:
    [cluster] = list(
        yaml.safe_load_all(
            (USER_MANIFESTS / "server-ha" / "postgres-cloudnativepg.yaml").read_text()
        )
    )
    assert (cluster["apiVersion"], cluster["kind"]) == ("postgresql.cnpg.io/v1", "Cluster")
    assert cluster["spec"]["instances"] == 3
    # CloudNativePG names the application Secret <cluster>-app.
    assert (
        f"{cluster['metadata']['name']}-app"
        == ENV["TUNNEL_SERVER_DATABASE"]["valueFrom"]["secretKeyRef"]["name"]
    )
