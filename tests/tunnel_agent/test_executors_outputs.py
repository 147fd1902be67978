"""A command's outputs are written only under names a Secret can hold, matched whole."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_agent.executors.errors import ExecutorError
from tunnel_agent.executors.outputs import OutputWriter
from tunnel_commands import OutputsSecret


class RecordingClient:
    """Keeps what would be applied; applies nothing."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    async def apply(self, resource: Any, namespace: str, body: dict[str, Any]) -> None:
        self.applied.append(body)


@pytest.mark.parametrize("name", ["key\n", "a b", "", "x" * 254, "k/ey"])
async def test_an_output_name_no_secret_key_can_be_is_refused_and_nothing_written(
    name: str,
) -> None:
    client = RecordingClient()
    writer = OutputWriter(client, OutputsSecret("apps", "out"))  # type: ignore[arg-type]
    with pytest.raises(ExecutorError, match="cannot be a Secret key"):
        await writer.write({name: "value", "fine": "value"})
    assert client.applied == []


async def test_valid_names_are_written() -> None:
    client = RecordingClient()
    writer = OutputWriter(client, OutputsSecret("apps", "out"))  # type: ignore[arg-type]
    assert await writer.write({"url": "https://x", "db.port": "5432"}) == ["db.port", "url"]
    [secret] = client.applied
    assert sorted(secret["data"]) == ["db.port", "url"]
