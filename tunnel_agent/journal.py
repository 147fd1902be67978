"""The agent's memory of commands, kept across reconnects and restarts.

It remembers which attempts it accepted (so it never runs one twice) and the
results the server has not acknowledged yet (so none is lost while the agent
is disconnected or restarts). Writes are coalesced: many changes in a short
time cost one write.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Any, Protocol

from .errors import CredentialsError

__all__ = ["Journal", "JournalBackend"]

logger = logging.getLogger(__name__)

#: Accepted attempts remembered; older ones are forgotten.
MAX_REMEMBERED = 2000
#: How long a change may wait to be written with others.
WRITE_DELAY = 0.05
#: How long to wait after a failed write before trying again.
RETRY_DELAY = 5.0


class JournalBackend(Protocol):
    """Where the journal lives: a file or a Secret (see credentials.py)."""

    async def load_journal(self) -> bytes | None: ...

    async def save_journal(self, data: bytes) -> None: ...


class Journal:
    def __init__(self, backend: JournalBackend) -> None:
        self._backend = backend
        self._accepted: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.results: dict[tuple[str, int], dict[str, Any]] = {}
        self._dirty = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    async def load(self) -> None:
        data = await self._backend.load_journal()
        if not data:
            return
        try:
            document = json.loads(data)
            for command_id, attempt in document.get("accepted", []):
                self._accepted[(str(command_id), int(attempt))] = None
            for item in document.get("results", []):
                self.results[(str(item["id"]), int(item["attempt"]))] = dict(item["result"])
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignored an unreadable command journal: %s", exc)

    def accepted(self, command_id: str, attempt: int) -> bool:
        return (command_id, attempt) in self._accepted

    def accept(self, command_id: str, attempt: int) -> None:
        self._accepted[(command_id, attempt)] = None
        while len(self._accepted) > MAX_REMEMBERED:
            self._accepted.popitem(last=False)
        self._dirty.set()

    def finish(self, command_id: str, attempt: int, result: dict[str, Any]) -> None:
        self.results[(command_id, attempt)] = result
        self._dirty.set()

    def acknowledged(self, command_id: str, attempt: int) -> None:
        if self.results.pop((command_id, attempt), None) is not None:
            self._dirty.set()

    async def run(self) -> None:
        """Write changes as they come (coalesced); runs until cancelled."""
        try:
            while True:
                await self._dirty.wait()
                await asyncio.sleep(WRITE_DELAY)
                if not await self._write():
                    await asyncio.sleep(RETRY_DELAY)
        finally:
            if self._dirty.is_set():
                await asyncio.shield(self._write())

    async def _write(self) -> bool:
        self._dirty.clear()
        document = {
            "accepted": [list(key) for key in self._accepted],
            "results": [
                {"id": key[0], "attempt": key[1], "result": result}
                for key, result in self.results.items()
            ],
        }
        try:
            await self._backend.save_journal(json.dumps(document).encode())
        except CredentialsError as exc:
            logger.error("cannot save the command journal: %s", exc)
            self._dirty.set()
            return False
        return True
