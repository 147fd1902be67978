"""The console's pages (GET): the fleet, a cluster, commands, the audit trail, users.

Each shows only what its viewer may see (``visibility``); none changes anything.
"""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import yaml
from aiohttp import web

from tunnel_server.api.users import audit_view
from tunnel_server.commands.api import command_view
from tunnel_server.console.fleet import SORT_KEYS, filter_rows, fleet_rows, sort_rows
from tunnel_server.console.guard import guarded
from tunnel_server.console.render import page
from tunnel_server.console.sessions import Viewer
from tunnel_server.console.state import CONSOLE
from tunnel_server.console.visibility import (
    require_admin_viewer,
    visible_cluster,
    visible_clusters,
    visible_command,
)
from tunnel_server.context import CONTEXT, ServerContext
from tunnel_server.errors import BadRequestError
from tunnel_server.store.base import AUDIT_KINDS, StoreError
from tunnel_server.store.commands import MAX_LIST
from tunnel_server.store.console import MAX_AUDIT_SEARCH, AuditQuery

__all__ = [
    "audit_export",
    "audit_page",
    "cluster_page",
    "command_page",
    "commands_page",
    "fleet_page",
    "users_page",
]

COMMAND_STATES = (
    "pending",
    "delivered",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
    "lost",
)


@guarded
async def fleet_page(request: web.Request, viewer: Viewer) -> web.StreamResponse:
    """Every cluster the viewer may see, filtered and sorted by the query."""
    context = request.app[CONTEXT]
    query = request.query
    text, state = query.get("q", ""), query.get("state", "")
    key = query.get("sort", "name")
    descending = query.get("order", "asc") == "desc"
    clusters = await visible_clusters(context, viewer.user)
    rows = await fleet_rows(context, request.app[CONSOLE].traffic, clusters)
    shown = sort_rows(filter_rows(rows, text, state), key, descending)
    return page(
        request,
        "fleet.html",
        viewer,
        rows=shown,
        total=len(rows),
        connected=sum(1 for row in rows if row.connected),
        q=text,
        state=state,
        sort=key if key in SORT_KEYS else "name",
        order="desc" if descending else "asc",
    )


@guarded
async def cluster_page(request: web.Request, viewer: Viewer) -> web.StreamResponse:
    """One cluster: its agent, requests in progress, recent audit, commands."""
    context = request.app[CONTEXT]
    cluster = await visible_cluster(context, viewer.user, request.match_info["cluster"])
    rows = await fleet_rows(context, request.app[CONSOLE].traffic, [cluster])
    agent = context.registry.get(cluster.name)
    now, wall = time.monotonic(), time.time()
    requests = [
        {
            "id": exchange.stream.id if exchange.stream is not None else None,
            "user": exchange.user,
            "verb": exchange.verb,
            "path": exchange.path,
            "seconds": now - exchange.started,
            "started": datetime.fromtimestamp(wall - (now - exchange.started), UTC),
        }
        for exchange in context.live.requests()
        if exchange.cluster == cluster.name and (viewer.is_admin or exchange.user == viewer.name)
    ]
    await context.audit.flush()
    audit = await context.store.search_audit(
        AuditQuery(cluster=cluster.name, user=None if viewer.is_admin else viewer.name, limit=20)
    )
    commands = await context.store.list_commands(
        cluster=cluster.name, limit=20, submitter=None if viewer.is_admin else viewer.name
    )
    return page(
        request,
        "cluster.html",
        viewer,
        cluster=cluster,
        row=rows[0],
        remote_addr=agent.remote_addr if agent is not None else cluster.remote_addr,
        agent=agent,
        replica=await reached_replica(context, cluster.name, agent is not None),
        requests=requests,
        audit=audit,
        commands=commands,
        kubeconfig_ttl=request.app[CONSOLE].kubeconfig_ttl,
    )


async def reached_replica(context: ServerContext, cluster: str, local: bool) -> str | None:
    """The server replica the cluster's agent reached: this one, or the one the store names."""
    if local:
        return context.replicas.name
    try:
        owner = await context.replicas.owner(cluster)
    except StoreError:
        return None
    return None if owner is None else owner.replica


@guarded
async def commands_page(request: web.Request, viewer: Viewer) -> web.StreamResponse:
    """Commands, newest first, filtered by cluster, state, submitter and type."""
    context = request.app[CONTEXT]
    query = request.query
    cluster = query.get("cluster", "").strip()
    state = query.get("state", "")
    submitter = query.get("submitter", "").strip()
    kind = query.get("type", "").strip()
    if state and state not in COMMAND_STATES:
        raise BadRequestError(f"state must be one of {', '.join(COMMAND_STATES)}")
    if not viewer.is_admin:
        submitter = viewer.name  # a user's own commands only, as the REST API lists them
    visible = {c.name for c in await visible_clusters(context, viewer.user)}
    if cluster and cluster not in visible:
        records = []
    else:
        records = await context.store.list_commands(
            cluster=cluster or None,
            state=state or None,
            limit=MAX_LIST,
            submitter=submitter or None,
        )
    records = [
        record
        for record in records
        if record.cluster in visible and (not kind or record.type == kind)
    ][:200]
    return page(
        request,
        "commands.html",
        viewer,
        commands=records,
        cluster=cluster,
        state=state,
        submitter=submitter,
        type=kind,
        states=COMMAND_STATES,
    )


@guarded
async def command_page(request: web.Request, viewer: Viewer) -> web.StreamResponse:
    """One command: its spec, attempts, outputs, and its log (live while it runs)."""
    context = request.app[CONTEXT]
    record = await visible_command(context, viewer.user, request.match_info["id"])
    lines = await context.store.command_log(record.id, after=0, limit=1000)
    result = record.result or {}
    outputs = result.get("outputs")
    return page(
        request,
        "command.html",
        viewer,
        command=record,
        view=command_view(record),
        # The spec as submitted: secrets are named by reference in it, never by value
        # (their values stay in the cluster: docs/commands.md).
        spec=yaml.safe_dump(record.spec, sort_keys=False, default_flow_style=False),
        lines=lines,
        after=lines[-1].seq if lines else 0,
        outputs=[str(name) for name in outputs] if isinstance(outputs, list) else [],
        summary=json.dumps(result.get("summary"), indent=2) if result.get("summary") else "",
    )


def _audit_query(request: web.Request, limit: int) -> tuple[AuditQuery, dict[str, str]]:
    query = request.query
    fields = {
        name: query.get(name, "").strip()
        for name in ("user", "cluster", "kind", "verb", "status", "since", "until")
    }
    if fields["kind"] and fields["kind"] not in AUDIT_KINDS:
        raise BadRequestError("kind must be proxy, command or admin")
    status = None
    if fields["status"]:
        if not fields["status"].isdigit() or len(fields["status"]) > 3:
            raise BadRequestError("status must be an HTTP status such as 403")
        status = int(fields["status"])
    return (
        AuditQuery(
            user=fields["user"] or None,
            cluster=fields["cluster"] or None,
            kind=fields["kind"] or None,
            verb=fields["verb"] or None,
            status=status,
            since=_utc_time(fields["since"], "since"),
            until=_utc_time(fields["until"], "until"),
            limit=limit,
        ),
        fields,
    )


def _utc_time(text: str, what: str) -> datetime | None:
    """A time from a form (``2026-05-01T12:00``, read as UTC), or None."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text[:32])
    except ValueError as exc:
        raise BadRequestError(f"{what} must be a time such as 2026-05-01T12:00 (UTC)") from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@guarded
async def audit_page(request: web.Request, viewer: Viewer) -> web.StreamResponse:
    """The audit trail searched (admins, as in the REST API)."""
    require_admin_viewer(viewer.user)
    context = request.app[CONTEXT]
    query, fields = _audit_query(request, 200)
    await context.audit.flush()
    events = await context.store.search_audit(query)
    return page(
        request,
        "audit.html",
        viewer,
        events=events,
        fields=fields,
        kinds=sorted(AUDIT_KINDS),
        # The same search, for the export links (the query's own text is not reused).
        export_query=urlencode({name: value for name, value in fields.items() if value}),
    )


_AUDIT_COLUMNS = (
    "id",
    "time",
    "user",
    "cluster",
    "kind",
    "verb",
    "path",
    "status",
    "bytes_in",
    "bytes_out",
    "duration_ms",
    "detail",
)


def _csv_cell(value: Any) -> str:
    """A cell a spreadsheet shows as text: never a formula (CSV injection)."""
    text = "" if value is None else json.dumps(value) if isinstance(value, dict) else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


@guarded
async def audit_export(request: web.Request, viewer: Viewer) -> web.StreamResponse:
    """The audit search as JSON lines (``format=jsonl``) or CSV (``format=csv``)."""
    require_admin_viewer(viewer.user)
    kind = request.query.get("format", "jsonl")
    if kind not in ("jsonl", "csv"):
        raise BadRequestError("format must be jsonl or csv")
    context = request.app[CONTEXT]
    query, _ = _audit_query(request, MAX_AUDIT_SEARCH)
    await context.audit.flush()
    events = await context.store.search_audit(query)
    if kind == "jsonl":
        body = "".join(json.dumps(audit_view(event), default=str) + "\n" for event in events)
        content_type = "application/x-ndjson"
    else:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(_AUDIT_COLUMNS)
        for event in events:
            record = audit_view(event)
            writer.writerow([_csv_cell(record[column]) for column in _AUDIT_COLUMNS])
        body = out.getvalue()
        content_type = "text/csv"
    return web.Response(
        text=body,
        content_type=content_type,
        charset="utf-8",
        headers={"Content-Disposition": f'attachment; filename="audit.{kind}"'},
    )


@guarded
async def users_page(request: web.Request, viewer: Viewer) -> web.StreamResponse:
    """Users and their grants, with the admin's forms (admins only)."""
    require_admin_viewer(viewer.user)
    context = request.app[CONTEXT]
    users = await context.store.list_users()
    grants = await context.store.list_grants()
    clusters = await context.store.list_clusters()
    return page(
        request,
        "users.html",
        viewer,
        users=users,
        grants=grants,
        clusters=[cluster.name for cluster in clusters],
    )
