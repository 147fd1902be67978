"""Moving a single replica's SQLite state to PostgreSQL (``tunnel-server migrate-store``).

Both ends are brought to their latest schema first (each engine's own
migrations). Then each table is copied in the order its references need:
the rows go into a temporary table by ``COPY`` and from there into the real
one with ``ON CONFLICT DO NOTHING``, so that running the move again copies
nothing twice and adds what is new. Values are converted by the column's
type in PostgreSQL (SQLite keeps times as text, flags as integers, lists as
JSON). The identity columns (audit ids, command log sequence numbers) keep
their values, and their sequences continue after them. Last, each table is
checked: every source row must be in the target, by its key.

What is not moved: the schema version (each engine has its own), console
sign-in sessions (people sign in again) and the readiness probe's table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg

from tunnel_server.store.base import StoreError
from tunnel_server.store.postgres import PostgresStore
from tunnel_server.store.postgres_errors import translate
from tunnel_server.store.sqlite import SqliteStore

__all__ = ["TABLES", "MovedTable", "move_sqlite_to_postgres"]

logger = logging.getLogger(__name__)

#: The tables moved, parents first, each with the columns of its key.
TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("clusters", ("name",)),
    ("bootstrap_tokens", ("token_hash",)),
    ("certificates", ("serial",)),
    ("users", ("name",)),
    ("api_tokens", ("token_hash",)),
    ("grants", ("user_name", "cluster")),
    ("audit", ("id",)),
    ("commands", ("id",)),
    ("command_logs", ("seq",)),
)
#: Rows read from SQLite and copied at once.
BATCH = 5000


@dataclass(frozen=True, slots=True)
class MovedTable:
    """What the move did for one table."""

    table: str
    source_rows: int
    #: Rows the target did not have before.
    added: int
    #: Source rows found in the target afterwards (the check): equal to source_rows.
    verified: int


async def move_sqlite_to_postgres(state_db: Path, url: str) -> list[MovedTable]:
    """Copy ``state_db`` (a server's ``state.db``) into the PostgreSQL database at ``url``.

    Raises :class:`StoreError` when either cannot be used, or when the check
    finds a source row missing from the target.
    """
    if not await asyncio.to_thread(state_db.is_file):
        raise StoreError(f"no SQLite state database at {state_db}")
    # Brings the file to this server's schema (as starting the server would).
    await (await SqliteStore.open(state_db)).close()
    target = await PostgresStore.open(url)
    where = target.where
    await target.close()
    source = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True)
    source.row_factory = sqlite3.Row
    try:
        connection = await asyncpg.connect(url, timeout=10)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        source.close()
        raise translate(exc, where, opening=True) from exc
    try:
        moved = [await _move_table(source, connection, table, key) for table, key in TABLES]
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        raise translate(exc, where) from exc
    finally:
        source.close()
        await connection.close()
    missing = [table for table in moved if table.verified != table.source_rows]
    if missing:
        raise StoreError(
            "the move is incomplete: "
            + ", ".join(f"{t.table} has {t.verified} of {t.source_rows} rows" for t in missing)
        )
    return moved


async def _move_table(
    source: sqlite3.Connection, target: asyncpg.Connection, table: str, key: tuple[str, ...]
) -> MovedTable:
    types = await _column_types(target, table)
    columns = [row[1] for row in source.execute(f"PRAGMA table_info({table})")]
    shared = [column for column in columns if column in types]
    converters = [_converter(types[column]) for column in shared]
    if table == "certificates":
        # SQLite keeps serial numbers as hex text (sqlite_codec.encode_serial).
        converters[shared.index("serial")] = lambda value: Decimal(int(value, 16))
    staging = f"moving_{table}"
    names = ", ".join(f'"{column}"' for column in shared)
    keys = ", ".join(f'"{column}"' for column in key)
    identity = await target.fetchval(
        "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attidentity <> ''",
        table,
    )
    async with target.transaction():
        await target.execute(
            f"CREATE TEMPORARY TABLE {staging} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DROP"
        )
        source_rows = 0
        cursor = source.execute(f"SELECT {names} FROM {table}")  # noqa: S608
        while rows := cursor.fetchmany(BATCH):
            records = [
                tuple(convert(value) for convert, value in zip(converters, row, strict=True))
                for row in rows
            ]
            await target.copy_records_to_table(staging, records=records, columns=shared)
            source_rows += len(records)
        overriding = " OVERRIDING SYSTEM VALUE" if identity else ""
        status = await target.execute(
            f"INSERT INTO {table} ({names}){overriding} SELECT {names} FROM {staging}"  # noqa: S608
            f" ON CONFLICT ({keys}) DO NOTHING"
        )
        added = int(status.split()[-1])
        verified = await target.fetchval(
            f"SELECT count(*) FROM {staging} JOIN {table} USING ({keys})"  # noqa: S608
        )
        if identity:
            # New rows take ids after the moved ones.
            await target.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', '{identity}'),"  # noqa: S608
                f" greatest((SELECT max({identity}) FROM {table}), 1))"
            )
    logger.info("moved %s: %d rows, %d new", table, source_rows, added)
    return MovedTable(table, source_rows, added, int(verified))


async def _column_types(target: asyncpg.Connection, table: str) -> dict[str, str]:
    rows = await target.fetch(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = $1",
        table,
    )
    return {row["column_name"]: row["data_type"] for row in rows}


def _converter(data_type: str) -> Callable[[Any], Any]:
    """How a SQLite value becomes the value of a PostgreSQL column of ``data_type``."""
    conversions: dict[str, Callable[[Any], Any]] = {
        "timestamp with time zone": _time,
        "boolean": bool,
        "ARRAY": _text_list,
        "numeric": lambda value: Decimal(str(value)),
        "jsonb": _json_text,
        "double precision": float,
        "bigint": int,
        "integer": int,
    }
    convert = conversions.get(data_type, lambda value: value)
    return lambda value: None if value is None else convert(value)


def _time(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _text_list(value: str) -> list[str]:
    items = json.loads(value)
    if not isinstance(items, list):
        raise StoreError(f"expected a JSON list, found {value[:40]!r}")
    return [str(item) for item in items]


def _json_text(value: str | bytes) -> str:
    text = value.decode() if isinstance(value, bytes) else value
    json.loads(text)  # refused here, by name, rather than by the COPY
    return text


def describe(moved: Sequence[MovedTable]) -> str:
    """One line per table, for the command's output."""
    return "\n".join(
        f"{table.table:<18} {table.source_rows:>9} rows  {table.added:>9} new"
        f"  {table.verified:>9} verified"
        for table in moved
    )
