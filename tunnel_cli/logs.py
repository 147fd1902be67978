"""Logging set-up for the entry points: text for people, JSON for machines.

Library modules only create named loggers; entry points call
:func:`configure_logging` once. Context travels as ``extra`` fields named in
:data:`CONTEXT_FIELDS` and shows on every line that carries it.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from .flags import FlagError

__all__ = ["CONTEXT_FIELDS", "QUIET_LIBRARIES", "configure_logging"]

#: Record attributes that identify what a line concerns.
CONTEXT_FIELDS = ("cluster", "stream", "command", "user", "remote")


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{name}={getattr(record, name)}" for name in CONTEXT_FIELDS if hasattr(record, name)
        )
        return f"{line} [{context}]" if context else line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


#: Libraries whose debug output carries secrets: kept at info or above.
QUIET_LIBRARIES = ("kubernetes_asyncio", "urllib3")


def configure_logging(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
    """Send every log line to ``stream`` (stderr) as text or JSON."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    elif fmt == "text":
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        raise FlagError(f"log format must be text or json, not {fmt!r}")
    number = logging.getLevelNamesMapping().get(level.upper())
    if number is None:
        raise FlagError(f"log level must be debug, info, warning or error, not {level!r}")
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)
    # aiohttp's access log would print every proxied path; we audit instead.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # At debug, kubernetes_asyncio logs every answer's body: Secrets with
    # their values, the agent's own key among them. Never below info.
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(number, logging.INFO))
