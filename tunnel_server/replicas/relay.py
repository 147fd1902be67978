"""The owner's side of a forwarded request: from the link to the cluster's agent.

Another replica received the request, authenticated its caller, checked the
grant, rewrote the identity and chose this replica because it holds the
cluster's agent session. It opens an ``http`` stream on its link to this
replica whose open headers are those the agent expects, plus the cluster's
name. This replica opens the same stream on the agent's session and relays
bytes both ways, each direction under the two streams' own flow control: a
slow caller slows its own stream, nothing else. A reset on either side resets
the other with the same code, so a revoked request or a caller gone away ends
at the agent (and the API server) as it would on one replica.

Nothing here authenticates anybody: only a replica (mTLS, the link) can
open these streams, and the identity in the head is the receiving replica's
decision.
"""

from __future__ import annotations

import asyncio
import logging

from protocol import ErrorCode, kinds
from protocol.errors import MalformedFrameError
from protocol.http import RequestHead, encode_response_head
from tunnel_mux import MuxStream, SessionError, StreamResetError
from tunnel_pki.errors import InvalidNameError
from tunnel_pki.names import validate_cluster_name
from tunnel_server.agents.registry import AgentRegistry
from tunnel_server.proxy.refusal import ProxyRefusal

__all__ = ["CLUSTER_HEADER", "relay_forwarded"]

logger = logging.getLogger(__name__)

#: The open header that names the cluster of a forwarded request.
CLUSTER_HEADER = "cluster"


async def relay_forwarded(registry: AgentRegistry, replica: str, link: MuxStream) -> None:
    """Relay one forwarded request's stream ``link`` to the cluster's agent and back."""
    try:
        cluster = validate_cluster_name(link.headers.get(CLUSTER_HEADER))  # type: ignore[arg-type]
        head = RequestHead.from_open_headers(link.headers)
    except (InvalidNameError, MalformedFrameError) as exc:
        link.reset(ErrorCode.PROTOCOL_ERROR, f"not a forwarded request: {exc}"[:120])
        return
    agent = registry.get(cluster)
    if agent is None:
        await _refuse(
            link,
            head,
            cluster,
            ProxyRefusal(
                503,
                "ServiceUnavailable",
                f"cluster {cluster}'s agent has just left server replica {replica}; "
                "it reconnects on its own: retry shortly",
                retry=True,
            ),
        )
        return
    try:
        upstream = agent.session.open_stream(
            kinds.STREAM_HTTP, head.to_open_headers(), end_stream=link.at_eof
        )
    except SessionError as exc:
        await _refuse(
            link,
            head,
            cluster,
            ProxyRefusal(503, "ServiceUnavailable", f"cluster {cluster} cannot take it: {exc}"),
        )
        return
    # The answer is copied in this task; the body, if any, in one of its own.
    uploader = None if link.at_eof else asyncio.create_task(_pipe(link, upstream))
    try:
        await agent.session.send_if_due()
        await _pipe(upstream, link)
        if uploader is not None:
            await uploader
    finally:
        if uploader is not None:
            uploader.cancel()
            await asyncio.gather(uploader, return_exceptions=True)
        # Cancelled (the receiving replica reset the stream): end it at the agent too.
        if upstream.error is None and not upstream.at_eof:
            error = link.error
            if isinstance(error, StreamResetError):
                upstream.reset(error.code, error.reason)
            else:
                upstream.reset(ErrorCode.CANCEL, "")


async def _pipe(source: MuxStream, sink: MuxStream) -> None:
    """Copy ``source`` to ``sink`` until its end; a failure of either resets the other
    with the same code (a session that ended: CANCEL)."""
    try:
        while data := await source.read():
            await sink.write(data)
    except SessionError as exc:
        other = sink if source.error is exc else source
        if isinstance(exc, StreamResetError):
            other.reset(exc.code, exc.reason)
        else:
            other.reset(ErrorCode.CANCEL, "")
        return
    sink.end()


async def _refuse(link: MuxStream, head: RequestHead, cluster: str, refusal: ProxyRefusal) -> None:
    """Answer the forwarded request with ``refusal``, as the agent would answer it."""
    target = f"/k8s/clusters/{cluster}{head.path}"
    body, headers = refusal.answer(head.header("accept") or "", target)
    await link.write(encode_response_head(refusal.code, refusal.reason, headers) + body)
    link.end()
