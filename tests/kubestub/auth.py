"""Who is asking, and may they: bearer tokens, impersonation, an access policy, a request log.

- :class:`Authenticator` maps bearer tokens to users; anything else is 401.
- :func:`impersonate` applies ``Impersonate-User`` / ``Impersonate-Group`` /
  ``Impersonate-Uid`` / ``Impersonate-Extra-*`` as the API server does,
  after checking the caller may impersonate (verb ``impersonate``).
- :class:`Policy` decides every request and every SelfSubjectAccessReview:
  deny rules first, then allow rules, then the default (allow).
- :class:`RequestLog` keeps every request's method, path and headers (bounded)
  so tests can prove which credentials and identities reached the server.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.kubestub.status import ApiError, bad_request, forbidden, unauthorized

__all__ = [
    "ADMIN",
    "RECORD",
    "Attributes",
    "Authenticator",
    "Policy",
    "RecordedRequest",
    "RequestLog",
    "Rule",
    "UserInfo",
    "impersonate",
    "self_subject_access_review",
    "self_subject_review",
    "self_subject_rules_review",
]

_MAX_IMPERSONATED_GROUPS = 64


@dataclass(frozen=True, slots=True)
class UserInfo:
    """An authenticated (or impersonated) identity."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The ``UserInfo`` object as authentication.k8s.io writes it."""
        info: dict[str, Any] = {"username": self.name}
        if self.uid:
            info["uid"] = self.uid
        if self.groups:
            info["groups"] = list(self.groups)
        if self.extra:
            info["extra"] = {key: list(values) for key, values in self.extra}
        return info


ADMIN = UserInfo("kubestub-admin", ("system:masters", "system:authenticated"))
"""The identity of the stand-in's own token, allowed everything by the default policy."""


@dataclass(frozen=True, slots=True)
class Attributes:
    """What a request (or an access review) asks to do, as the authorizer sees it."""

    user: UserInfo
    verb: str
    resource: str = ""
    subresource: str = ""
    api_group: str = ""
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class Rule:
    """A policy rule; ``*`` matches anything. ``resource`` may be ``pods/exec``.

    ``user`` is a user's name, or ``group:NAME`` for everyone in group ``NAME``
    (so a small role table can speak of the groups a grant adds).
    """

    user: str = "*"
    verb: str = "*"
    resource: str = "*"
    namespace: str = "*"
    api_group: str = "*"
    name: str = "*"

    def matches(self, attributes: Attributes) -> bool:
        """Whether this rule concerns ``attributes``."""
        resource = attributes.resource
        if attributes.subresource:
            resource = f"{resource}/{attributes.subresource}"
        return (
            (
                self.user in ("*", attributes.user.name)
                or (
                    self.user.startswith("group:")
                    and self.user.removeprefix("group:") in attributes.user.groups
                )
            )
            and self.verb in ("*", attributes.verb)
            and self.resource in ("*", resource)
            and self.namespace in ("*", attributes.namespace)
            and self.api_group in ("*", attributes.api_group)
            and self.name in ("*", attributes.name)
        )


class Policy:
    """Deny rules, then allow rules, then the default decision (allow unless told otherwise)."""

    def __init__(self, *, default_allow: bool = True) -> None:
        self.default_allow = default_allow
        self._deny: list[Rule] = []
        self._allow: list[Rule] = []

    def deny(
        self,
        user: str = "*",
        verb: str = "*",
        resource: str = "*",
        *,
        namespace: str = "*",
        api_group: str = "*",
        name: str = "*",
    ) -> Rule:
        """Forbid ``user`` to ``verb`` ``resource``: those requests get the real 403 Status."""
        rule = Rule(user, verb, resource, namespace, api_group, name)
        self._deny.append(rule)
        return rule

    def allow(
        self,
        user: str = "*",
        verb: str = "*",
        resource: str = "*",
        *,
        namespace: str = "*",
        api_group: str = "*",
        name: str = "*",
    ) -> Rule:
        """Permit explicitly (useful with ``default_allow=False``)."""
        rule = Rule(user, verb, resource, namespace, api_group, name)
        self._allow.append(rule)
        return rule

    def clear(self) -> None:
        """Forget every rule (the default decision stays)."""
        self._deny.clear()
        self._allow.clear()

    def allows(self, attributes: Attributes) -> bool:
        """The decision for ``attributes``."""
        if any(rule.matches(attributes) for rule in self._deny):
            return False
        if any(rule.matches(attributes) for rule in self._allow):
            return True
        return self.default_allow

    @property
    def rules(self) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
        """The (deny, allow) rules."""
        return tuple(self._deny), tuple(self._allow)

    def check(self, attributes: Attributes) -> None:
        """Raise the API server's 403 Status if ``attributes`` are not allowed."""
        if not self.allows(attributes):
            raise forbidden(
                attributes.user.name,
                attributes.verb,
                attributes.resource,
                attributes.api_group,
                attributes.name,
                attributes.namespace,
                attributes.subresource,
            )


class Authenticator:
    """Bearer tokens and the users they stand for."""

    def __init__(self) -> None:
        self._tokens: dict[str, UserInfo] = {}

    def add_token(self, user: UserInfo, token: str | None = None) -> str:
        """Register a token for ``user`` (a new random one if None); return it."""
        token = token or secrets.token_urlsafe(32)
        self._tokens[token] = user
        return token

    def authenticate(self, request: web.Request) -> UserInfo:
        """The user of the request's bearer token; 401 Unauthorized otherwise."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        user = self._tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise unauthorized()
        return user


def impersonate(request: web.Request, user: UserInfo, policy: Policy) -> UserInfo:
    """The identity the request acts as: ``user``, or whom its Impersonate-* headers name."""
    headers = request.headers
    name = headers.get("Impersonate-User")
    groups = headers.getall("Impersonate-Group", [])
    uid = headers.get("Impersonate-Uid", "")
    extras: dict[str, list[str]] = {}
    for key, value in headers.items():
        if key.lower().startswith("impersonate-extra-"):
            extras.setdefault(key[len("impersonate-extra-") :].lower(), []).append(value)
    if name is None:
        if groups or uid or extras:
            raise ApiError(
                500,
                "InternalError",
                "requested impersonation of groups, uid or extra without impersonating a user",
            )
        return user
    if len(groups) > _MAX_IMPERSONATED_GROUPS:
        raise bad_request("too many Impersonate-Group headers")
    policy.check(Attributes(user, "impersonate", "users", name=name))
    for group in groups:
        policy.check(Attributes(user, "impersonate", "groups", name=group))
    if uid:
        policy.check(Attributes(user, "impersonate", "uids", name=uid))
    for key in extras:
        policy.check(
            Attributes(
                user,
                "impersonate",
                "userextras",
                subresource=key,
                api_group="authentication.k8s.io",
            )
        )
    all_groups = list(groups)
    if name.startswith("system:serviceaccount:"):
        namespace = name.split(":")[2] if name.count(":") >= 3 else ""
        all_groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    if name != "system:anonymous" and "system:authenticated" not in all_groups:
        all_groups.append("system:authenticated")
    return UserInfo(
        name,
        tuple(all_groups),
        uid,
        tuple((key, tuple(values)) for key, values in sorted(extras.items())),
    )


@dataclass(slots=True)
class RecordedRequest:
    """One request as it reached the stand-in (headers exactly as received).

    ``user`` is the identity it acted as (after impersonation; None if it
    failed authentication) and ``status`` the HTTP status it was answered
    with (0 while it is in progress; 101 for an upgrade).
    """

    method: str
    path: str
    query_string: str
    headers: tuple[tuple[str, str], ...]
    remote: str = ""
    user: UserInfo | None = None
    status: int = 0

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        values = self.header_values(name)
        return values[0] if values else None

    def header_values(self, name: str) -> list[str]:
        """Every value of header ``name`` (any case), in order."""
        lowered = name.lower()
        return [value for key, value in self.headers if key.lower() == lowered]


RECORD = web.RequestKey("kubestub_record", RecordedRequest)
"""Where a request keeps its own entry in the request log (upgrades mark it 101)."""


class RequestLog:
    """The last ``limit`` requests, in arrival order; tests can wait for one to arrive."""

    def __init__(self, limit: int = 10_000) -> None:
        self._entries: deque[RecordedRequest] = deque(maxlen=limit)
        self._changed = asyncio.Event()

    def record(self, request: web.Request) -> RecordedRequest:
        """Append ``request`` (its method, path, query and every header)."""
        entry = RecordedRequest(
            method=request.method,
            path=request.path,
            query_string=request.query_string,
            headers=tuple((key, value) for key, value in request.headers.items()),
            remote=request.remote or "",
        )
        self._entries.append(entry)
        request[RECORD] = entry
        self._changed.set()
        self._changed = asyncio.Event()
        return entry

    def __iter__(self) -> Iterator[RecordedRequest]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every recorded request."""
        self._entries.clear()

    def matching(self, predicate: Callable[[RecordedRequest], bool]) -> list[RecordedRequest]:
        """The recorded requests for which ``predicate`` holds."""
        return [entry for entry in self._entries if predicate(entry)]

    async def wait_for(self, predicate: Callable[[RecordedRequest], bool]) -> RecordedRequest:
        """The first recorded request matching ``predicate``, waiting for it if need be."""
        while True:
            for entry in self._entries:
                if predicate(entry):
                    return entry
            await self._changed.wait()


def self_subject_access_review(body: Any, user: UserInfo, policy: Policy) -> dict[str, Any]:
    """Answer a SelfSubjectAccessReview for ``user`` with ``policy``'s decision."""
    spec = body.get("spec") if isinstance(body, dict) else None
    if not isinstance(spec, dict):
        raise bad_request("spec is required")
    resource = spec.get("resourceAttributes")
    non_resource = spec.get("nonResourceAttributes")
    if isinstance(resource, dict):
        attributes = Attributes(
            user,
            str(resource.get("verb", "")),
            str(resource.get("resource", "")),
            str(resource.get("subresource", "")),
            str(resource.get("group", "")),
            str(resource.get("namespace", "")),
            str(resource.get("name", "")),
        )
    elif isinstance(non_resource, dict):
        attributes = Attributes(
            user, str(non_resource.get("verb", "")), str(non_resource.get("path", ""))
        )
    else:
        raise ApiError(
            422,
            "Invalid",
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: '
            'Invalid value: "null": exactly one of nonResourceAttributes or resourceAttributes '
            "must be specified",
        )
    allowed = policy.allows(attributes)
    status: dict[str, Any] = {"allowed": allowed}
    if allowed:
        status["reason"] = "allowed by the kubestub policy"
    return {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }


def self_subject_rules_review(body: Any, user: UserInfo, policy: Policy) -> dict[str, Any]:
    """Answer a SelfSubjectRulesReview: the allow rules that apply to ``user``."""
    spec = body.get("spec") if isinstance(body, dict) else {}
    denies, allows = policy.rules
    rules = [
        {"verbs": [rule.verb], "apiGroups": [rule.api_group], "resources": [rule.resource]}
        for rule in allows
        if rule.user in ("*", user.name)
    ]
    if policy.default_allow:
        rules.insert(0, {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})
    return {
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec or {},
        "status": {
            "resourceRules": rules,
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
            if policy.default_allow
            else [],
            "incomplete": bool(denies),
        },
    }


def self_subject_review(user: UserInfo) -> dict[str, Any]:
    """Answer a SelfSubjectReview (``kubectl auth whoami``)."""
    return {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "status": {"userInfo": user.as_dict()},
    }
