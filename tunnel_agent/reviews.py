"""``kubectl auth can-i`` through the tunnel: the API server's answer, narrowed by the policy.

A SelfSubjectAccessReview or SelfSubjectRulesReview asks the API server what
the caller may do; the agent's own policy (``--read-only``, ``--namespaces``,
no Secret values) refuses more than the cluster's RBAC. So the agent relays
the review, asking for JSON (kubectl's typed client accepts it, and a JSON
answer echoes the attributes asked about), and narrows the answer before it
goes back: an access review the policy would refuse becomes ``allowed:
false`` with the policy's reason; a rules review loses the verbs, namespaces
and Secret rights the policy takes away. A read-only agent says "no" to
``can-i create pods``.
"""

from __future__ import annotations

import json
from typing import Any

from protocol.http import Headers
from tunnel_kube import ApiRequest

from .policy import ProxyPolicy

__all__ = ["MAX_REVIEW", "is_review", "json_accepted", "narrow_review", "narrows"]

#: The largest review answer narrowed (larger ones are refused, not relayed unread).
MAX_REVIEW = 1 << 20
_READ_VERBS = ("get", "list", "watch")
_INTERACTIVE = frozenset({"exec", "attach", "portforward", "proxy"})
_NON_RESOURCE = (
    "/api",
    "/apis",
    "/version",
    "/openapi",
    "/healthz",
    "/livez",
    "/readyz",
    "/.well-known",
    "/openid",
)
_ACCESS = "selfsubjectaccessreviews"
_RULES = "selfsubjectrulesreviews"


def is_review(request: ApiRequest) -> bool:
    """A caller's SelfSubjectAccessReview or SelfSubjectRulesReview (a create of one)."""
    return (
        request.verb == "create"
        and request.api_group == "authorization.k8s.io"
        and request.resource in (_ACCESS, _RULES)
        and not request.namespace
        and not request.name
        and not request.subresource
    )


def narrows(policy: ProxyPolicy) -> bool:
    """Whether ``policy`` refuses anything the cluster's RBAC could allow."""
    return policy.read_only or bool(policy.namespaces) or not policy.allow_secret_values


def json_accepted(headers: Headers) -> Headers:
    """``headers`` asking for plain JSON: the answer is read, and echoes what was asked."""
    kept = ((n, v) for n, v in headers if n not in ("accept", "accept-encoding"))
    return (*kept, ("accept", "application/json"))


def narrow_review(policy: ProxyPolicy, request: ApiRequest, body: bytes) -> bytes | None:
    """The review's answer with the policy applied, or None to leave it as it is."""
    try:
        review = json.loads(body)
    except ValueError:
        return None
    if not isinstance(review, dict) or not isinstance(review.get("status"), dict):
        return None
    spec = review.get("spec") if isinstance(review.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    if request.resource == _ACCESS:
        if review["status"].get("allowed") is not True:
            return None
        why = _access_refusal(policy, spec)
        if why is None:
            return None
        review["status"] = {"allowed": False, "denied": True, "reason": f"the agent: {why}"}
    else:
        review["status"] = _rules(policy, str(spec.get("namespace") or ""), review["status"])
    return json.dumps(review, separators=(",", ":")).encode()


def _access_refusal(policy: ProxyPolicy, spec: dict[str, Any]) -> str | None:
    """Why the policy refuses what an access review asks about, or None."""
    resource = spec.get("resourceAttributes")
    if isinstance(resource, dict):
        verb = str(resource.get("verb") or "")
        plural = str(resource.get("resource") or "")
        subresource = str(resource.get("subresource") or "")
        group = str(resource.get("group") or "")
        namespace = str(resource.get("namespace") or "")
        reading = verb in _READ_VERBS and subresource not in _INTERACTIVE
        if policy.read_only and not reading:
            return f"this agent is read-only: {subresource or verb} is not allowed"
        if policy.namespaces:
            if namespace not in policy.namespaces:
                where = namespace or "cluster-wide"
                return f"this agent serves namespaces {_scope(policy)} only, not {where} requests"
            if (group, plural) == ("", "namespaces") and not reading:
                return "this agent serves what is in its namespaces, not the Namespace objects"
        secret = (group, plural) == ("", "secrets")
        if secret and not policy.allow_secret_values and verb not in _READ_VERBS:
            return "Secrets can only be listed by name through this tunnel"
        return None
    non_resource = spec.get("nonResourceAttributes")
    if isinstance(non_resource, dict):
        verb = str(non_resource.get("verb") or "")
        path = str(non_resource.get("path") or "").rstrip("/")
        if policy.read_only and verb not in ("get", "head"):
            return f"this agent is read-only: {verb} is not allowed"
        served = any(path == p or path.startswith(p + "/") for p in _NON_RESOURCE)
        if policy.namespaces and not served:
            return f"this agent serves namespaces {_scope(policy)} only, not {path[:64]!r}"
    return None


def _rules(policy: ProxyPolicy, namespace: str, status: dict[str, Any]) -> dict[str, Any]:
    """A rules review's status, narrowed: what the policy refuses is taken out."""
    narrowed = dict(status)
    notes = []
    rules = [rule for rule in status.get("resourceRules") or [] if isinstance(rule, dict)]
    if policy.namespaces and namespace not in policy.namespaces:
        rules = []
        notes.append(f"this agent serves namespaces {_scope(policy)} only")
    if policy.read_only:
        kept = []
        for rule in rules:
            verbs = [str(verb) for verb in rule.get("verbs") or []]
            reads = list(_READ_VERBS) if "*" in verbs else [v for v in verbs if v in _READ_VERBS]
            if reads:
                kept.append(rule | {"verbs": reads})
        rules = kept
        notes.append("this agent is read-only")
        non_resource = [
            rule | {"verbs": [v for v in rule.get("verbs") or [] if v in ("get", "*")]}
            for rule in status.get("nonResourceRules") or []
            if isinstance(rule, dict)
        ]
        narrowed["nonResourceRules"] = [
            rule | {"verbs": ["get"]} for rule in non_resource if rule["verbs"]
        ]
    narrowed["resourceRules"] = rules
    if notes:
        error = "the agent narrows these rules: " + "; ".join(notes)
        previous = str(status.get("evaluationError") or "")
        narrowed["evaluationError"] = f"{previous}; {error}" if previous else error
    return narrowed


def _scope(policy: ProxyPolicy) -> str:
    return ", ".join(sorted(policy.namespaces))
