"""Kubernetes API calls on objects of any kind, as the identity a command acts as.

The executors apply, read, list and delete objects whose kinds are known only
at run time (custom resources included), so they speak the REST API
directly through :class:`~tunnel_agent.kubeapi.KubeApi`'s session, and find
each kind's resource (plural name, scope) through discovery. Each request
carries the agent's credentials and, unless the command acts as the agent,
``Impersonate-User``/``-Group`` of its submitter
(:class:`~tunnel_agent.identity.RunIdentity`), so the cluster's RBAC judges it
as it would judge the submitter's kubectl. Failures become
:class:`KubeRequestError` carrying the API server's status and message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from ..identity import AGENT, RunIdentity
from ..kubeapi import KubeApi
from .errors import KubeRequestError

__all__ = ["FIELD_MANAGER", "ApiResource", "KubeClient", "split_api_version"]

#: The field manager of everything the executors apply.
FIELD_MANAGER = "k8s-reverse-tunnel"
_MAX_RESPONSE = 32 << 20


def split_api_version(api_version: str) -> tuple[str, str]:
    """``("apps", "v1")`` from ``apps/v1``; ``("", "v1")`` from ``v1``."""
    group, _, version = api_version.rpartition("/")
    return group, version


@dataclass(frozen=True, slots=True)
class ApiResource:
    """A kind as the API serves it: where its objects live and whether they are namespaced."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The collection (no name) or object path; all namespaces when ``namespace`` is None."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        return base + (f"/{quote(name, safe='')}" if name else "")


class KubeClient:
    """REST calls with discovery, as ``identity``; one per run (discovery is cached for it)."""

    def __init__(self, kube: KubeApi, identity: RunIdentity = AGENT) -> None:
        self.kube = kube
        self.identity = identity
        self._discovered: dict[str, dict[str, ApiResource]] = {}

    def as_agent(self) -> KubeClient:
        """The same API as the agent itself, for the agent's own records (apply sets)."""
        if self.identity.as_agent:
            return self
        return KubeClient(self.kube)

    async def resource(self, api_version: str, kind: str) -> ApiResource | None:
        """The resource of ``kind`` in ``api_version``, or None if the cluster serves none."""
        resources = self._discovered.get(api_version)
        if resources is None:
            resources = await self._discover(api_version)
            self._discovered[api_version] = resources
        return resources.get(kind)

    def forget_discovery(self) -> None:
        """Discover again on the next lookup (new CustomResourceDefinitions are served)."""
        self._discovered.clear()

    async def _discover(self, api_version: str) -> dict[str, ApiResource]:
        group, version = split_api_version(api_version)
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            listing = await self.request("GET", path)
        except KubeRequestError as exc:
            if exc.status == 404:
                return {}
            raise
        found: dict[str, ApiResource] = {}
        for entry in listing.get("resources") or []:
            name = entry.get("name", "")
            if "/" in name or not entry.get("kind") or entry["kind"] in found:
                continue  # a subresource, or a second resource of the kind
            found[entry["kind"]] = ApiResource(
                group, version, entry["kind"], name, bool(entry.get("namespaced"))
            )
        return found

    async def get(self, resource: ApiResource, namespace: str | None, name: str) -> Any:
        return await self.request("GET", resource.path(namespace, name))

    async def list(
        self,
        resource: ApiResource,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        params = {
            key: value
            for key, value in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if value
        }
        body = await self.request("GET", resource.path(namespace), params=params)
        items = body.get("items") if isinstance(body, dict) else None
        return [item for item in items or [] if isinstance(item, dict)]

    async def apply(self, resource: ApiResource, namespace: str | None, obj: dict[str, Any]) -> Any:
        """Server-side apply of ``obj``, taking over fields other managers hold."""
        name = obj["metadata"]["name"]
        return await self.request(
            "PATCH",
            resource.path(namespace, name),
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    async def delete(self, resource: ApiResource, namespace: str | None, name: str) -> None:
        """Delete an object (its dependents in the background); gone already is fine."""
        try:
            await self.request(
                "DELETE",
                resource.path(namespace, name),
                params={"propagationPolicy": "Background"},
            )
        except KubeRequestError as exc:
            if exc.status != 404:
                raise

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One API call answered with JSON."""
        data = await self.request_bytes(
            method, path, params=params, body=body, content_type=content_type
        )
        try:
            return json.loads(data) if data else {}
        except ValueError as exc:
            raise KubeRequestError(f"{method} {path}: the API server sent invalid JSON") from exc

    async def request_bytes(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        max_bytes: int = _MAX_RESPONSE,
        accept: str = "application/json",
    ) -> bytes:
        """One API call; the body, at most ``max_bytes`` (the rest is left unread)."""
        target = path + (f"?{urlencode(params)}" if params else "")
        headers = {"Accept": accept}
        authorization = await self.kube.authorization()
        if authorization:
            headers["Authorization"] = authorization
        impersonation = self.identity.headers()
        payload = None
        if body is not None:
            headers["Content-Type"] = content_type
            payload = json.dumps(body).encode()
        try:
            async with self.kube.session.request(
                method,
                self.kube.url(target),
                # Pairs: one Impersonate-Group header per group.
                headers=[*headers.items(), *impersonation],
                data=payload,
                allow_redirects=False,
            ) as response:
                data = await _read(response.content, max_bytes)
                status = response.status
        except (aiohttp.ClientError, OSError) as exc:
            raise KubeRequestError(f"cannot reach the Kubernetes API: {exc}") from exc
        if status >= 300:
            raise _status_error(method, path, status, data, self.identity)
        return data


async def _read(content: aiohttp.StreamReader, limit: int) -> bytes:
    data = bytearray()
    while len(data) < limit:
        chunk = await content.read(min(65536, limit - len(data)))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _status_error(
    method: str, path: str, status: int, data: bytes, identity: RunIdentity
) -> KubeRequestError:
    message, reason = "", ""
    try:
        document = json.loads(data)
        if isinstance(document, dict):
            message = str(document.get("message") or "")
            reason = str(document.get("reason") or "")
    except ValueError:
        message = data.decode("utf-8", "replace")
    # Not cut here: the API server quotes invalid values, which may hold a
    # secret, and a secret cut in two is no longer masked. The message is
    # masked first and cut after (dispatch.py), bounded by the answer's size.
    detail = f"HTTP {status}: {message or reason or 'no message'}"
    if status == 403:
        # The API server names the user; the groups and the way there are ours to say.
        detail += f" (the command acts as {identity.describe()})"
    return KubeRequestError(
        f"{method} {path}: {detail}", status=status, reason=reason, detail=detail
    )
