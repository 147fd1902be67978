"""What a signed-in user may see: the clusters they hold a grant on (an admin: all), and
their own commands on those.

The answers come from the same places as the REST API's and the relay's: the
access cache's grants (:meth:`AccessCache.grant`, asked for one cluster) and
the store's (:meth:`Store.list_grants`, for the fleet). A cluster a user may
not see answers exactly as one that does not exist (404), as the REST API does
for commands: which clusters exist is for admins to know.
"""

from __future__ import annotations

from tunnel_cli import describe_duration
from tunnel_server.context import ServerContext
from tunnel_server.errors import ForbiddenError, NotFoundApiError
from tunnel_server.store.base import Cluster, NotFoundError, User
from tunnel_server.store.commands import CommandRecord

__all__ = [
    "may_see_cluster",
    "require_admin_viewer",
    "visible_cluster",
    "visible_clusters",
    "visible_command",
]


async def visible_clusters(context: ServerContext, user: User) -> list[Cluster]:
    """The clusters ``user`` may see, by name: all for an admin, else those granted."""
    clusters = await context.store.list_clusters()
    if user.is_admin:
        return clusters
    granted = {grant.cluster for grant in await context.store.list_grants(user=user.name)}
    return [cluster for cluster in clusters if cluster.name in granted]


async def may_see_cluster(context: ServerContext, user: User, cluster: str) -> bool:
    """Whether ``user`` may see ``cluster`` (whether or not it exists)."""
    return user.is_admin or await context.access.grant(user.name, cluster) is not None


async def visible_cluster(context: ServerContext, user: User, name: str) -> Cluster:
    """The cluster ``name`` if ``user`` may see it; else 404, as for one that does not exist."""
    if await may_see_cluster(context, user, name):
        try:
            return await context.store.get_cluster(name)
        except NotFoundError:
            pass
    raise NotFoundApiError(f"no cluster {name[:63]!r} that you may see", code="cluster_unknown")


async def visible_command(context: ServerContext, user: User, command_id: str) -> CommandRecord:
    """The command if ``user`` may see it: an admin, or its submitter while they still
    hold a grant on its cluster. Else 404, as for one that does not exist."""
    try:
        record = await context.store.get_command(command_id)
    except NotFoundError:
        record = None
    if record is not None and (
        user.is_admin
        or (record.submitter == user.name and await may_see_cluster(context, user, record.cluster))
    ):
        return record
    retention = describe_duration(context.settings.command_retention)
    raise NotFoundApiError(
        f"no command {command_id[:64]!r} that you may see: none has this id, or it finished"
        f" more than {retention} ago and was deleted"
    )


def require_admin_viewer(user: User) -> None:
    """403 unless ``user`` is an admin (as :func:`tunnel_server.access.auth.require_admin`)."""
    if not user.is_admin:
        raise ForbiddenError(f"user {user.name} is not an admin", code="admin_required")
