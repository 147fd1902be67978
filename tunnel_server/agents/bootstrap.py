"""Bootstrap: an agent trades a one-time token and a CSR for its client certificate.

The key is generated on the agent and never sent. The CSR is checked before
the token is spent, so a malformed request does not burn a good token.
"""

from __future__ import annotations

import logging

from aiohttp import web

from protocol import kinds
from tunnel_pki.csr import parse_csr
from tunnel_pki.errors import PkiError
from tunnel_pki.names import validate_cluster_name
from tunnel_server.api.httpjson import json_response, read_json, require_str, timestamp
from tunnel_server.clock import utcnow
from tunnel_server.context import CONTEXT
from tunnel_server.errors import (
    ApiError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    UnauthorizedError,
)
from tunnel_server.store.base import (
    TokenClusterMismatchError,
    TokenExpiredError,
    TokenUnknownError,
    TokenUsedError,
    hash_token,
)

__all__ = ["BOOTSTRAP_PATH", "bootstrap"]

logger = logging.getLogger(__name__)

BOOTSTRAP_PATH = kinds.PATH_BOOTSTRAP
_MAX_BODY = 32 * 1024


async def bootstrap(request: web.Request) -> web.Response:
    """``POST {"cluster", "token", "csr"}`` -> ``{"certificate", "ca", "not_after"}``."""
    metrics = request.app[CONTEXT].metrics
    try:
        response = await _bootstrap(request)
    except ApiError as exc:
        metrics.bootstraps.labels(exc.code).inc()
        raise
    metrics.bootstraps.labels("issued").inc()
    return response


async def _bootstrap(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    body = await read_json(request, _MAX_BODY)
    cluster = require_str(body, "cluster", max_length=63)
    token = require_str(body, "token", max_length=256)
    csr = require_str(body, "csr", max_length=16 * 1024)
    try:
        validate_cluster_name(cluster)
        parse_csr(csr.encode())
    except PkiError as exc:
        raise BadRequestError(str(exc), code="invalid_request") from exc
    now = utcnow()
    log = {"cluster": cluster, "remote": request.remote}
    try:
        await context.store.consume_bootstrap_token(hash_token(token), cluster, now)
    except TokenUnknownError as exc:
        logger.warning("bootstrap refused: unknown token", extra=log)
        raise UnauthorizedError(str(exc), code="token_unknown") from exc
    except TokenExpiredError as exc:
        logger.warning("bootstrap refused: expired token", extra=log)
        raise UnauthorizedError(str(exc), code="token_expired") from exc
    except TokenUsedError as exc:
        logger.warning("bootstrap refused: token already used", extra=log)
        raise ConflictError(str(exc), code="token_used") from exc
    except TokenClusterMismatchError as exc:
        logger.warning("bootstrap refused: token of another cluster", extra=log)
        raise ForbiddenError(str(exc), code="token_cluster_mismatch") from exc
    issued = context.identity.ca.sign_client_csr(
        csr.encode(), cluster, context.settings.identity.client_cert_lifetime, now
    )
    await context.store.record_certificate(
        issued.serial, cluster, issued.fingerprint, issued.not_before, issued.not_after
    )
    logger.info("bootstrapped an agent; certificate valid until %s", issued.not_after, extra=log)
    return json_response(
        {
            "cluster": cluster,
            "certificate": issued.cert_pem.decode(),
            "ca": context.identity.ca.cert_pem.decode(),
            "not_after": timestamp(issued.not_after),
        }
    )
