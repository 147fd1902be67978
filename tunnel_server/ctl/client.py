"""A small blocking client of the server's REST API, for tunnelctl."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from protocol.errors import TunnelError

__all__ = ["ApiClient", "CtlError"]

#: The largest response tunnelctl reads.
MAX_RESPONSE = 64 * 1024 * 1024


class CtlError(TunnelError):
    """What tunnelctl reports in one line before exiting non-zero."""


@dataclass(frozen=True, slots=True)
class ApiClient:
    server: str
    token: str
    ssl_context: ssl.SSLContext
    timeout: float = 30.0

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Send a JSON request; return the decoded JSON answer or raise CtlError."""
        connection, response = self._send(method, path, body, headers, self.timeout)
        try:
            data = response.read(MAX_RESPONSE + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise CtlError(f"lost the connection to {self.server}: {exc}") from exc
        finally:
            connection.close()
        if len(data) > MAX_RESPONSE:
            raise CtlError("the server's answer is too large")
        try:
            decoded = json.loads(data) if data else None
        except ValueError as exc:
            raise CtlError(f"the server answered HTTP {response.status} with non-JSON") from exc
        if response.status >= 400:
            raise _api_error(response.status, response.reason, decoded)
        return decoded

    def records(self, path: str) -> Iterator[dict[str, Any]]:
        """GET a stream of JSON lines, yielding each record as it arrives."""
        connection, response = self._send("GET", path, None, None, None)
        try:
            if response.status >= 400:
                data = response.read(MAX_RESPONSE)
                try:
                    decoded = json.loads(data)
                except ValueError:
                    decoded = None
                raise _api_error(response.status, response.reason, decoded)
            while line := response.readline(4 * 1024 * 1024):
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise CtlError("the server sent a malformed record") from exc
                if isinstance(record, dict):
                    yield record
        except (OSError, http.client.HTTPException) as exc:
            raise CtlError(f"lost the connection to {self.server}: {exc}") from exc
        finally:
            connection.close()

    def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        extra_headers: dict[str, str] | None,
        timeout: float | None,
    ) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
        parts = urlsplit(self.server)
        if parts.scheme != "https" or not parts.hostname:
            raise CtlError(f"the server URL must be https://HOST[:PORT], not {self.server!r}")
        connection = http.client.HTTPSConnection(
            parts.hostname, parts.port or 443, context=self.ssl_context, timeout=timeout
        )
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        headers.update(extra_headers or {})
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, parts.path.rstrip("/") + path, payload, headers)
            return connection, connection.getresponse()
        except ssl.SSLCertVerificationError as exc:
            connection.close()
            raise CtlError(
                f"the server's certificate does not chain to the CA given with --ca "
                f"({exc.verify_message})"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise CtlError(f"cannot reach {self.server}: {exc}") from exc


def _api_error(status: int, reason: str, decoded: Any) -> CtlError:
    error = decoded.get("error", {}) if isinstance(decoded, dict) else {}
    message = error.get("message") or reason
    return CtlError(f"{message} (HTTP {status} {error.get('code', '')})".strip())


def segment(value: str) -> str:
    """A path segment, safely quoted."""
    return quote(value, safe="")
