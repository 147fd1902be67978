"""PostgreSQL's errors, and asyncpg's, as the store's (``postgres``), said once and safely.

asyncpg raises a class per SQLSTATE, and the OSErrors of reaching the server
pass through it. :func:`translate` turns each into the :class:`StoreError`
its caller receives. Messages never carry what could be secret: the URL's
password (:func:`redact_url`), or a server's DETAIL, which may quote the key
values of a row (token hashes).
"""

from __future__ import annotations

import re

import asyncpg

from tunnel_server.store.base import (
    AlreadyExistsError,
    InvalidValueError,
    NotFoundError,
    StoreError,
)

__all__ = ["CANNOT_WRITE", "RETRY_STATES", "message", "redact_url", "translate"]

#: SQLSTATEs that say the transaction lost a race and may simply be run again.
RETRY_STATES = frozenset({"40001", "40P01"})
#: SQLSTATEs that say nothing can be written: read-only, disk full, out of space or memory,
#: an I/O error (postgresql.org/docs/current/errcodes-appendix.html).
CANNOT_WRITE = frozenset({"25006", "53100", "53200", "58030"})

_PASSWORD_IN_URL = re.compile(r"(://[^:/@?#]*):[^@/?#]*@")
_PASSWORD_PARAMETER = re.compile(r"(?i)(password=)[^&\s]*")


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: fit for logs and messages."""
    return _PASSWORD_PARAMETER.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1:***@", url))


def message(exc: BaseException) -> str:
    """What an exception says, without a server's DETAIL (which may quote key values)."""
    if isinstance(exc, asyncpg.PostgresError):
        return str(exc.args[0] if exc.args else "") or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def translate(exc: BaseException, where: str, *, opening: bool = False) -> StoreError:
    """The StoreError for an asyncpg error or an OSError the operation did not foresee."""
    if isinstance(exc, asyncpg.UniqueViolationError):
        return AlreadyExistsError("a record with this key exists already")
    if isinstance(exc, asyncpg.ForeignKeyViolationError):
        return NotFoundError("the user or cluster referred to does not exist")
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError | asyncpg.DataError):
        return InvalidValueError(f"the state database refused a value: {message(exc)}")
    if isinstance(exc, asyncpg.QueryCanceledError):
        return StoreError(
            f"the state database did not answer in time ({message(exc)}); retry later"
        )
    if isinstance(exc, TimeoutError):
        step = "connecting to" if opening else "waiting for"
        return StoreError(f"timed out {step} the state database at {where}")
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        return StoreError(
            f"the state database at {where} refused the login ({message(exc)}):"
            " check the user and password"
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return StoreError(f"cannot use the state database at {where}: {message(exc)}")
    if isinstance(
        exc,
        OSError
        | asyncpg.PostgresConnectionError
        | asyncpg.CannotConnectNowError
        | asyncpg.TooManyConnectionsError
        | asyncpg.AdminShutdownError
        | asyncpg.InterfaceError,
    ):
        return StoreError(f"cannot reach the state database at {where}: {message(exc)}")
    if isinstance(exc, asyncpg.PostgresError):
        return StoreError(f"the state database failed: {message(exc)} [{exc.sqlstate}]")
    return StoreError(f"the state database failed: {type(exc).__name__}")
