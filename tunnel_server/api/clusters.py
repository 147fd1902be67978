"""The REST API for clusters, under /api/v1 (admin only).

Every response is JSON; errors are ``{"error": {"status", "code", "message"}}``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from aiohttp import web

from tunnel_pki.errors import PkiError
from tunnel_pki.names import validate_cluster_name
from tunnel_server import __version__
from tunnel_server.access.auth import authenticate, confirm, require_admin
from tunnel_server.agents.manifest import ManifestError, render_agent_manifest, unservable
from tunnel_server.api.httpjson import json_response, read_json, require_str, timestamp
from tunnel_server.clock import utcnow
from tunnel_server.context import CONTEXT, ServerContext
from tunnel_server.errors import BadRequestError, NotFoundApiError
from tunnel_server.statedir import new_token
from tunnel_server.store.base import Cluster, NotFoundError, hash_token
from tunnel_server.store.replicas import SessionOwner

__all__ = ["setup_api"]

logger = logging.getLogger(__name__)

RBAC_VARIANTS = ("full", "read-only", "namespaced")
_NAMESPACE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def setup_api(app: web.Application) -> None:
    router = app.router
    router.add_get("/api/v1/whoami", whoami)
    router.add_get("/api/v1/status", fleet_status)
    router.add_get("/api/v1/clusters", list_clusters)
    router.add_post("/api/v1/clusters", add_cluster)
    router.add_get("/api/v1/clusters/{cluster}", get_cluster)
    router.add_delete("/api/v1/clusters/{cluster}", delete_cluster)
    router.add_post("/api/v1/clusters/{cluster}/token", new_bootstrap_token)
    router.add_post("/api/v1/clusters/{cluster}/revoke", revoke_cluster)


async def whoami(request: web.Request) -> web.Response:
    user = await authenticate(request)
    return json_response({"name": user.name, "groups": list(user.groups), "admin": user.is_admin})


async def fleet_status(request: web.Request) -> web.Response:
    """One screen of fleet health: agents, versions, commands."""
    await require_admin(request)
    context = request.app[CONTEXT]
    clusters = await context.store.list_clusters()
    local = context.registry.connected()
    owners = await context.replicas.owners()
    connected = set(local) | set(owners)
    outdated = sorted(
        cluster.name
        for cluster in clusters
        if (local[cluster.name].agent_version if cluster.name in local else cluster.agent_version)
        not in (None, __version__)
    )
    now = utcnow()
    replicas = [
        {
            "name": replica.name,
            "address": replica.address,
            "version": replica.version,
            "agents": len(local) if replica.name == context.replicas.name else replica.agents,
            "healthy": replica.name == context.replicas.name or replica.alive(now),
            "draining": replica.draining,
            "heartbeat_at": timestamp(replica.heartbeat_at),
            "started_at": timestamp(replica.started_at),
        }
        for replica in await context.replicas.replicas()
    ]
    counts = await context.store.count_commands(utcnow() - timedelta(hours=24))
    return json_response(
        {
            "server_version": __version__,
            "clusters": {
                "total": len(clusters),
                "connected": sum(1 for c in clusters if c.name in connected),
                "disconnected": sorted(c.name for c in clusters if c.name not in connected),
            },
            "agents_out_of_date": outdated,
            "replica": context.replicas.name,
            "replicas": replicas,
            "commands": {
                "pending": counts.get("pending", 0),
                "running": counts.get("running", 0) + counts.get("delivered", 0),
                "succeeded_24h": counts.get("succeeded", 0),
                "failed_24h": sum(
                    counts.get(state, 0) for state in ("failed", "timed_out", "lost")
                ),
                "cancelled_24h": counts.get("cancelled", 0),
            },
        }
    )


async def list_clusters(request: web.Request) -> web.Response:
    await require_admin(request)
    context = request.app[CONTEXT]
    clusters = await context.store.list_clusters()
    owners = await context.replicas.owners()
    return json_response([_cluster_view(context, cluster, owners) for cluster in clusters])


async def get_cluster(request: web.Request) -> web.Response:
    await require_admin(request)
    context = request.app[CONTEXT]
    cluster = await _cluster(request)
    return json_response(_cluster_view(context, cluster, await context.replicas.owners()))


async def add_cluster(request: web.Request) -> web.Response:
    user = await require_admin(request)
    context = request.app[CONTEXT]
    body = await read_json(request)
    name = _valid_name(require_str(body, "name", max_length=63))
    rbac = body.get("rbac", "full")
    if rbac not in RBAC_VARIANTS:
        raise BadRequestError(f"rbac must be one of {', '.join(RBAC_VARIANTS)}")
    namespaces = _namespaces(body.get("namespaces", []), rbac)
    await confirm(request, user)
    # Checked before storing: a refused request leaves no cluster behind.
    cluster = await context.store.add_cluster(name, utcnow(), rbac, namespaces)
    logger.info("cluster registered by %s", user.name, extra={"cluster": name})
    await context.audit.admin_action(user.name, "cluster.add", name, cluster=name)
    install = await _issue_bootstrap(context, cluster)
    view = _cluster_view(context, cluster, {})
    return json_response({"cluster": view, **install}, status=201)


def _namespaces(value: Any, rbac: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > 64:
        raise BadRequestError("namespaces must be a list of at most 64 names")
    names = tuple(dict.fromkeys(str(item) for item in value))
    for item in names:
        if not _NAMESPACE.fullmatch(item):
            raise BadRequestError(f"{item[:64]!r} is not a valid namespace name")
        reason = unservable(item)
        if reason is not None:
            raise BadRequestError(reason)
    if rbac == "namespaced" and not names:
        raise BadRequestError("a namespaced cluster needs its namespaces (--namespaces a,b)")
    if rbac != "namespaced" and names:
        raise BadRequestError("namespaces go with rbac namespaced only")
    return names


async def new_bootstrap_token(request: web.Request) -> web.Response:
    user = await require_admin(request)
    context = request.app[CONTEXT]
    cluster = await _cluster(request)
    install = await _issue_bootstrap(context, cluster)
    # Enough to take over the cluster's agent: who asked for it is on record.
    logger.info("bootstrap token issued to %s", user.name, extra={"cluster": cluster.name})
    await context.audit.admin_action(user.name, "cluster.token", cluster.name, cluster.name)
    return json_response(install, status=201)


async def revoke_cluster(request: web.Request) -> web.Response:
    user = await require_admin(request)
    context = request.app[CONTEXT]
    cluster = await _cluster(request)
    revoked = await context.revoke_cluster(cluster.name)
    disconnected = await context.registry.disconnect(
        cluster.name, "the cluster's certificates were revoked"
    )
    logger.warning("cluster revoked by %s", user.name, extra={"cluster": cluster.name})
    await context.audit.admin_action(user.name, "cluster.revoke", cluster.name, cluster.name)
    return json_response({"revoked_certificates": revoked, "disconnected": disconnected})


async def delete_cluster(request: web.Request) -> web.Response:
    user = await require_admin(request)
    context = request.app[CONTEXT]
    cluster = await _cluster(request)
    await context.revoke_cluster(cluster.name)
    await context.registry.disconnect(cluster.name, "the cluster was deleted")
    await context.store.delete_cluster(cluster.name)
    # Its grants went with it (its requests ended with its agent's session).
    await context.live.access_changed(cluster=cluster.name)
    logger.warning("cluster deleted by %s", user.name, extra={"cluster": cluster.name})
    await context.audit.admin_action(user.name, "cluster.delete", cluster.name, cluster.name)
    return json_response({"deleted": cluster.name})


async def _issue_bootstrap(context: ServerContext, cluster: Cluster) -> dict[str, Any]:
    now = utcnow()
    token = new_token("tbt")
    expires_at = now + context.settings.identity.bootstrap_token_ttl
    await context.store.add_bootstrap_token(hash_token(token), cluster.name, now, expires_at)
    try:
        manifest = render_agent_manifest(
            cluster=cluster.name,
            server_url=context.settings.listen.public_url,
            ca_pem=context.identity.ca_bundle_pem.decode(),
            bootstrap_token=token,
            image=context.settings.agent_image,
            rbac=cluster.rbac,
            namespaces=cluster.namespaces,
        )
    except ManifestError as exc:
        raise BadRequestError(f"cannot render the install manifest: {exc}") from exc
    return {"bootstrap_token": token, "expires_at": timestamp(expires_at), "manifest": manifest}


async def _cluster(request: web.Request) -> Cluster:
    name = request.match_info["cluster"]
    try:
        return await request.app[CONTEXT].store.get_cluster(_valid_name(name))
    except NotFoundError as exc:
        raise NotFoundApiError(f"no cluster named {name!r}", code="cluster_unknown") from exc


def _valid_name(name: str) -> str:
    try:
        return validate_cluster_name(name)
    except PkiError as exc:
        raise BadRequestError(str(exc), code="invalid_name") from exc


def _cluster_view(
    context: ServerContext, cluster: Cluster, owners: Mapping[str, SessionOwner]
) -> dict[str, Any]:
    """The cluster as the API shows it; ``owners``: which replica holds each agent's
    session (empty on a replica alone)."""
    owner = owners.get(cluster.name)
    view: dict[str, Any] = {
        "name": cluster.name,
        "connected": owner is not None,
        # The replica that holds the agent's socket (this one's name when alone).
        "replica": None if owner is None else owner.replica,
        "agent_version": cluster.agent_version,
        "remote_addr": cluster.remote_addr,
        "connected_since": None if owner is None else timestamp(cluster.connected_since),
        "last_seen": timestamp(cluster.last_seen),
        "rbac": cluster.rbac,
        "namespaces": list(cluster.namespaces),
        "created_at": timestamp(cluster.created_at),
    }
    agent = context.registry.get(cluster.name)
    if agent is not None:
        # Connected: what the live session knows is newer than the store's record.
        view.update(
            connected=True,
            replica=context.replicas.name,
            agent_version=agent.agent_version,
            remote_addr=agent.remote_addr,
            connected_since=timestamp(agent.connected_since),
            last_seen=timestamp(utcnow()),
        )
    return view
