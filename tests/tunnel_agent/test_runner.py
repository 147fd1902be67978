"""The command runner's reporting across reconnects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.journal import Journal
from tunnel_agent.runner import CommandRunner, Job, JobContext
from tunnel_mux import SessionClosedError

from ..support import until


class FakeSession:
    """Records the report streams asked of it; this one's connection is gone."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    def open_stream(self, kind: str, headers: dict[str, Any]) -> None:
        self.asked.append(headers)
        raise SessionClosedError("this session has ended")


async def never_runs(spec: dict[str, Any], context: JobContext) -> dict[str, Any]:
    raise AssertionError("no job runs in this test")


async def test_a_report_winding_down_on_the_old_session_resumes_on_the_new_one(
    tmp_path: Path,
) -> None:
    runner = CommandRunner(
        never_runs, lambda spec: None, Journal(DirectoryCredentialStore(tmp_path))
    )
    job = Job("c1", 1, "query", "q", {}, 60.0, state="finished", result={"outcome": "succeeded"})
    runner.jobs[job.key] = job
    old, new = FakeSession(), FakeSession()
    runner.connected(old)  # type: ignore[arg-type]
    # The reconnect comes before the old report noticed its session ended:
    runner.connected(new)  # type: ignore[arg-type]
    await until(lambda: new.asked != [])
    assert new.asked[0] == {"id": "c1", "attempt": 1}
    runner.disconnected()
    await until(lambda: not job.reporting)
