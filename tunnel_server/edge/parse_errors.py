"""What aiohttp says about a caller's malformed request: one line at INFO, not a traceback.

aiohttp answers a request it cannot parse (a malformed chunked body, a bad
header) with 400 and logs it as an ERROR with a traceback, whoever sent it:
an unauthenticated client could fill the log with tracebacks. The lean front
door logs its own refusals as one INFO line with the reason; the connections
it hands to aiohttp get the same through :class:`ParseErrorLogger`, given to
aiohttp's server as its logger. Anything else aiohttp logs passes unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["ParseErrorLogger"]


class ParseErrorLogger(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger, with its parse errors told in one INFO line."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else None
        if isinstance(error, HttpProcessingError):
            # The message is aiohttp's, about the caller's bytes: no secret, bounded.
            reason = " ".join(str(error.message).split())[:200]
            self.logger.info("refused a malformed request (%d): %s", error.code, reason)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return msg, kwargs
