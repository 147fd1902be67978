"""Command delivery over the socket: durable queue, leases, attempts, cancellation."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tunnel_pki.tls import client_context
from tunnel_server.clock import utcnow
from tunnel_server.config import CommandSettings, ServerSettings

from ..support import until
from .commands_support import Script, command, command_agent, records_of
from .harness import RunningServer, agent_settings, running_server, server_settings


async def submit(server: RunningServer, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    status, answer = await server.api(
        "POST", "/api/v1/clusters/prod-eu/commands", {"spec": spec, **extra}
    )
    assert status in (200, 201), answer
    result: dict[str, Any] = answer
    return result


async def until_state(server: RunningServer, command_id: str, *states: str) -> dict[str, Any]:
    """Wait (on the dispatcher's change signal, not a clock) for one of ``states``."""
    while True:
        status, answer = await server.api("GET", f"/api/v1/commands/{command_id}")
        assert status == 200
        if answer["state"] in states:
            result: dict[str, Any] = answer
            return result
        await server.context.commands.wait_change(command_id, patience=1.0)


def quick_leases(state: Path, port: int = 0) -> Any:
    settings = server_settings(state, port=port)
    return dataclasses.replace(settings, commands=CommandSettings(lease=1.0, reap_interval=0.05))


async def test_command_runs_once_with_logs_and_result(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    script = Script()
    settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
    async with command_agent(settings, script) as (agent, _):
        await agent.wait_connected()
        created = await submit(server, command("ok-web"))
        assert created["state"] in ("pending", "delivered", "running", "succeeded")
        done = await until_state(server, created["id"], "succeeded", "failed")
    assert done["state"] == "succeeded"
    assert done["attempt"] == 1
    assert done["result"] == {"summary": {"steps": 3}, "outputs": ["answer"]}
    assert script.runs == [(created["id"], 1)]
    lines = await log_lines(server, created["id"])
    assert lines == ["ok-web: step 0", "ok-web: step 1", "ok-web: step 2"]


async def log_lines(server: RunningServer, command_id: str) -> list[str]:
    records = await records_of(server, command_id, query="")
    return [record["text"] for record in records if "text" in record]


async def test_command_submitted_while_disconnected_runs_after_connect_exactly_once(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    created = await submit(server, command("ok-late"))
    assert created["state"] == "pending"
    script = Script()
    async with command_agent(agent_settings(server, "prod-eu", token, tmp_path / "c"), script):
        done = await until_state(server, created["id"], "succeeded")
    assert done["attempt"] == 1
    assert script.runs == [(created["id"], 1)]


async def test_idempotency_key_returns_the_existing_command(server: RunningServer) -> None:
    await server.add_cluster("prod-eu")
    first = await submit(server, command("ok-a"), idempotency_key="deploy-42")
    again = await submit(server, command("ok-a"), idempotency_key="deploy-42")
    assert again["id"] == first["id"]
    _, listed = await server.api("GET", "/api/v1/commands?cluster=prod-eu")
    assert [c["id"] for c in listed] == [first["id"]]


async def test_invalid_spec_is_refused_naming_the_field(server: RunningServer) -> None:
    await server.add_cluster("prod-eu")
    spec = command("ok-x")
    spec["type"] = "teleport"
    status, answer = await server.api("POST", "/api/v1/clusters/prod-eu/commands", {"spec": spec})
    assert status == 400
    assert "type" in answer["error"]["message"]
    del spec["type"]
    status, answer = await server.api("POST", "/api/v1/clusters/prod-eu/commands", {"spec": spec})
    assert status == 400


async def test_dispatch_needs_a_commands_grant(server: RunningServer) -> None:
    await server.add_cluster("prod-eu")
    status, alice = await server.api("POST", "/api/v1/users", {"name": "alice"})
    assert status == 201
    await server.api("PUT", "/api/v1/grants/alice/prod-eu", {})
    path = "/api/v1/clusters/prod-eu/commands"
    status, answer = await server.api("POST", path, {"spec": command("ok-a")}, token=alice["token"])
    assert status == 403
    assert "--commands" in answer["error"]["message"]
    await server.api("PUT", "/api/v1/grants/alice/prod-eu", {"commands": True})
    status, answer = await server.api("POST", path, {"spec": command("ok-a")}, token=alice["token"])
    assert status == 201
    status, events = await server.api("GET", "/api/v1/audit?kind=command")
    assert any(e["user"] == "alice" and e["verb"] == "submit" for e in events)


async def test_a_full_queue_answers_429_and_loses_nothing_it_holds(tmp_path: Path) -> None:
    settings = server_settings(tmp_path / "state")
    settings = dataclasses.replace(settings, commands=CommandSettings(max_pending=3))
    async with running_server(settings) as server:
        await server.add_cluster("prod-eu")
        await server.add_cluster("prod-us")
        held = [await submit(server, command(f"ok-{n}"), idempotency_key=f"k{n}") for n in range(3)]
        assert server._http is not None
        async with server._http.post(
            f"{server.url}/api/v1/clusters/prod-eu/commands",
            json={"spec": command("ok-over")},
            headers={"Authorization": f"Bearer {server.admin_token}"},
            ssl=client_context(server.ca_pem),
        ) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "1"
            error = (await response.json())["error"]
        assert error["code"] == "queue_full"
        assert "3 commands waiting" in error["message"]
        assert "--max-pending-commands" in error["message"]
        # A retried submission with its key still finds its command.
        again = await submit(server, command("ok-0"), idempotency_key="k0")
        assert again["id"] == held[0]["id"]
        # Other clusters have their own room.
        status, answer = await server.api(
            "POST", "/api/v1/clusters/prod-us/commands", {"spec": command("ok-us")}
        )
        assert (status, answer["state"]) == (201, "pending")
        # Nothing held was dropped; a cancelled one makes room again.
        _, listed = await server.api("GET", "/api/v1/commands?cluster=prod-eu")
        assert sorted(c["id"] for c in listed) == sorted(c["id"] for c in held)
        await server.api("POST", f"/api/v1/commands/{held[1]['id']}/cancel")
        assert (await submit(server, command("ok-after")))["state"] == "pending"


async def test_cancel_stops_a_running_command(server: RunningServer, tmp_path: Path) -> None:
    token = await server.add_cluster("prod-eu")
    script = Script()
    async with command_agent(agent_settings(server, "prod-eu", token, tmp_path / "c"), script):
        created = await submit(server, command("hang-forever"))
        await script.started.get()
        await until_state(server, created["id"], "running")
        status, _ = await server.api("POST", f"/api/v1/commands/{created['id']}/cancel")
        assert status == 200
        done = await until_state(server, created["id"], "cancelled")
    assert script.cancelled == [created["id"]]
    assert "stopped" in done["error"]


async def test_timeout_stops_the_command(server: RunningServer, tmp_path: Path) -> None:
    token = await server.add_cluster("prod-eu")
    script = Script()
    async with command_agent(agent_settings(server, "prod-eu", token, tmp_path / "c"), script):
        created = await submit(server, command("hang-slow", timeout="1s"))
        done = await until_state(server, created["id"], "timed_out")
    assert script.cancelled == [created["id"]]
    assert "timeout" in done["error"]


async def test_pending_command_is_cancelled_without_delivery(server: RunningServer) -> None:
    await server.add_cluster("prod-eu")
    created = await submit(server, command("ok-never"))
    status, answer = await server.api("POST", f"/api/v1/commands/{created['id']}/cancel")
    assert status == 200
    assert answer["state"] == "cancelled"


@dataclasses.dataclass
class StoppedMidRun:
    """A command running on its agent, whose server was stopped: the agent waits for one."""

    script: Script
    command: dict[str, Any]
    #: The stopped server's port, where the agent looks for it.
    port: int


@asynccontextmanager
async def a_run_with_its_server_stopped(
    tmp_path: Path, settings: ServerSettings, name: str
) -> AsyncIterator[StoppedMidRun]:
    """Command ``name`` running on an agent of a server on ``settings``, then the server
    stopped; the agent runs until the block ends."""
    script = Script()
    async with running_server(settings) as server:
        token = await server.add_cluster("prod-eu")
        agent = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        async with command_agent(agent, script):
            created = await submit(server, command(name))
            await script.started.get()
            await until_state(server, created["id"], "running")
            await server.stop()
            yield StoppedMidRun(script, created, server.port)


async def test_result_survives_a_server_restart_during_the_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    settings = server_settings(state)
    async with a_run_with_its_server_stopped(tmp_path, settings, "gate-across-restart") as run:
        # The command finishes while the server is down; the agent keeps
        # its result until a server acknowledges it.
        run.script.gate.set()
        async with running_server(server_settings(state, port=run.port)) as restarted:
            done = await until_state(restarted, run.command["id"], "succeeded")
    assert done["attempt"] == 1
    assert run.script.runs == [(run.command["id"], 1)]


async def test_a_run_outlives_a_server_down_longer_than_its_lease_and_agents_slow_to_return(
    tmp_path: Path,
) -> None:
    """A server upgrade that took minutes, agents back off and return later still."""
    state = tmp_path / "state"
    async with a_run_with_its_server_stopped(tmp_path, quick_leases(state), "gate-long") as run:
        command_id = run.command["id"]
        # The server comes back where the agent does not look for it yet
        # (another port): its lease ran out long ago, and the agent is away.
        async with running_server(quick_leases(state)) as back:
            started = utcnow()
            later = started + timedelta(seconds=30)  # thirty leases on
            assert await back.context.commands.reap(later, started) == []
            _, shown = await back.api("GET", f"/api/v1/commands/{command_id}")
            assert shown["state"] == "running"
        # Then where the agent finds it: the agent resumes attempt 1 and finishes it.
        async with running_server(quick_leases(state, run.port)) as restarted:
            run.script.gate.set()
            done = await until_state(restarted, command_id, "succeeded")
    assert done["attempt"] == 1
    assert run.script.runs == [(command_id, 1)]


@pytest.mark.parametrize(("attempts", "final"), [(2, "succeeded"), (1, "lost")])
async def test_lost_agent_lapses_the_lease_and_the_retry_policy_applies(
    tmp_path: Path, attempts: int, final: str
) -> None:
    async with running_server(quick_leases(tmp_path / "state")) as server:
        token = await server.add_cluster("prod-eu")
        settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        first = Script()
        async with command_agent(settings, first):
            created = await submit(server, command("gate-retry", attempts=attempts))
            await first.started.get()
        # The agent is gone mid-run; a replacement agent of the cluster comes up.
        second = Script()
        second.gate.set()
        replacement = dataclasses.replace(settings, bootstrap_token=None)
        async with command_agent(replacement, second):
            done = await until_state(server, created["id"], "succeeded", "lost")
    assert done["state"] == final
    if final == "succeeded":
        assert done["attempt"] == 2
        assert second.runs == [(created["id"], 2)]
    else:
        assert "lost" in done["error"]
        assert second.runs == []


async def test_same_attempt_is_never_run_twice(server: RunningServer, tmp_path: Path) -> None:
    token = await server.add_cluster("prod-eu")
    script = Script()
    async with command_agent(agent_settings(server, "prod-eu", token, tmp_path / "c"), script) as (
        agent,
        runner,
    ):
        await agent.wait_connected()
        offer = {"id": "a1b2", "attempt": 1, "type": "query", "name": "ok-dup"}
        body = {"spec": command("ok-dup"), "timeout_seconds": 60, "identity": {"agent": True}}
        assert runner._accept(offer, body) == {"accepted": True}
        assert runner._accept(offer, body) == {"accepted": False, "reason": "duplicate"}
        assert runner._accept({**offer, "attempt": 2}, body) == {"accepted": True}


async def test_many_commands_run_in_order_within_the_concurrency_limit(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    script = Script()
    async with command_agent(
        agent_settings(server, "prod-eu", token, tmp_path / "c"), script, concurrency=1
    ):
        created = [await submit(server, command(f"ok-{n}")) for n in range(20)]
        for item in created:
            await until_state(server, item["id"], "succeeded")
        # Every offer and report stream ended on both sides: none leaked.
        connection = server.context.registry.get("prod-eu")
        assert connection is not None
        await until(lambda: connection.session.streams == 0, max_turns=10**7)
        assert connection.session.connection.open_streams == 0
    # Offers may overlap, but one agent with concurrency 1 runs them in order.
    assert [run[0] for run in script.runs] == [item["id"] for item in created]


def test_a_read_only_agent_runs_queries_only() -> None:
    from tunnel_agent.commands import validate_spec

    validate_spec(command("ok-query"), read_only=True)
    manifests = {
        "apiVersion": "tunnel/v1",
        "type": "manifests",
        "name": "app",
        "spec": {"objects": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}]},
    }
    validate_spec(manifests)
    with pytest.raises(ValueError, match="read-only"):
        validate_spec(manifests, read_only=True)


def test_an_agent_runs_only_the_command_types_its_owner_allows() -> None:
    from tunnel_agent.commands import validate_spec

    allowed = frozenset({"query", "manifests", "flow"})
    validate_spec(command("ok-query"), command_types=allowed)
    git = {"url": "https://git.example.com/infra.git", "ref": "main", "path": "infra"}
    tofu = {"apiVersion": "tunnel/v1", "type": "tofu", "name": "infra", "spec": {"git": git}}
    refusal = "this agent does not run tofu commands; it runs flow, manifests, query"
    with pytest.raises(ValueError, match=refusal):
        validate_spec(tofu, command_types=allowed)
    step = {"name": "infra", "type": "tofu", "git": git}
    flow = {"apiVersion": "tunnel/v1", "type": "flow", "name": "release", "spec": {"steps": [step]}}
    with pytest.raises(ValueError, match=refusal):  # nor as a step of a flow
        validate_spec(flow, command_types=allowed)
