"""Hearing the database's change notifications (``LISTEN``), on a connection of its own.

A pooled connection goes back to the pool after each call, so the listener
keeps one of its own: it ``LISTEN``\\s on
:data:`~tunnel_server.store.postgres_schema.EVENTS_CHANNEL`, probes the
connection now and then (a server gone silent is noticed within
:data:`PROBE_INTERVAL` + :data:`PROBE_TIMEOUT` seconds), and when the connection
fails, connects again with jittered back-off and says ``resync``: what was
announced meanwhile is lost, and the replica checks again what it caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Callable

import asyncpg

from tunnel_server.store.postgres_errors import message
from tunnel_server.store.postgres_schema import EVENTS_CHANNEL
from tunnel_server.store.replicas import StoreEvent

__all__ = ["PROBE_INTERVAL", "PROBE_TIMEOUT", "listening"]

logger = logging.getLogger(__name__)

#: Seconds between probes of the listening connection.
PROBE_INTERVAL = 2.0
#: Seconds a probe may take before the connection is taken for dead.
PROBE_TIMEOUT = 3.0
#: Seconds to wait before connecting again, at first and at most (full jitter).
RETRY_FIRST = 0.2
RETRY_CAP = 5.0
#: Seconds to connect and log in.
CONNECT_TIMEOUT = 10.0
#: The longest notification payload read; the triggers send well under 1 KiB.
MAX_PAYLOAD = 4096


@contextlib.asynccontextmanager
async def listening(
    url: str, where: str, on_event: Callable[[StoreEvent], None]
) -> AsyncIterator[None]:
    """Call ``on_event`` with each change announced while the block runs."""
    task = asyncio.create_task(_listen_forever(url, where, on_event), name="store listener")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _listen_forever(url: str, where: str, on_event: Callable[[StoreEvent], None]) -> None:
    delay = RETRY_FIRST
    while True:
        try:
            await _listen_once(url, on_event)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            logger.warning(
                "not hearing the state database's changes (%s): %s; connecting again",
                where,
                message(exc) if isinstance(exc, asyncpg.PostgresError) else exc,
            )
        await asyncio.sleep(random.uniform(0, delay))  # noqa: S311 - jitter
        delay = min(RETRY_CAP, delay * 2)


async def _listen_once(url: str, on_event: Callable[[StoreEvent], None]) -> None:
    """Listen until the connection fails (raised)."""

    def heard(_connection: object, _pid: int, _channel: str, payload: object) -> None:
        event = _parse(payload) if isinstance(payload, str) else None
        if event is None:
            logger.warning("ignored a notification that is not a change: %.80r", payload)
            return
        _deliver(on_event, event)

    connection = await asyncpg.connect(
        url,
        timeout=CONNECT_TIMEOUT,
        server_settings={"application_name": "tunnel-server listener"},
    )
    try:
        await connection.add_listener(EVENTS_CHANNEL, heard)
        # Whatever changed before this LISTEN went unheard: check again.
        _deliver(on_event, StoreEvent("resync"))
        while True:
            await asyncio.sleep(PROBE_INTERVAL)
            await connection.fetchval("SELECT 1", timeout=PROBE_TIMEOUT)
    finally:
        connection.terminate()


def _deliver(on_event: Callable[[StoreEvent], None], event: StoreEvent) -> None:
    try:
        on_event(event)
    except Exception:
        logger.exception("handling a %s change failed", event.kind)


def _parse(payload: str) -> StoreEvent | None:
    if len(payload) > MAX_PAYLOAD:
        return None
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    return StoreEvent.from_payload(value) if isinstance(value, dict) else None
