"""upstream_path: which paths a caller may ask the cluster for, and which are refused."""

from __future__ import annotations

import itertools

import pytest

from tunnel_server.proxy.refusal import ProxyRefusal
from tunnel_server.proxy.request import upstream_path

CLUSTER = "/k8s/clusters/prod"


def allowed(rest: str) -> bool:
    try:
        upstream_path(CLUSTER + rest, "prod")
    except ProxyRefusal:
        return False
    return True


def reference(rest: str) -> bool:
    """The rule in its plainest form: no dot segment, no empty segment, nothing encoded."""
    path = rest.partition("?")[0]
    lowered = path.lower()
    if any(code in lowered for code in ("%2f", "%5c", "%2e")) or "\\" in path:
        return False
    return not any(segment in (".", "..", "") for segment in path.split("/")[1:-1]) and (
        path.split("/")[-1] not in (".", "..")
    )


@pytest.mark.parametrize(
    "rest", ["/.", "/..", "/./api", "/../api", "/api/.", "/api/..", "/api/./v1", "/api/../v1"]
)
def test_a_dot_segment_is_refused_wherever_it_stands(rest: str) -> None:
    assert not allowed(rest)


@pytest.mark.parametrize("rest", ["/.well-known", "/api/..v1", "/api/v1.", "/api/v1..", "/a.b/c"])
def test_dots_inside_a_segment_are_allowed(rest: str) -> None:
    assert allowed(rest)


def test_every_short_path_follows_the_plain_rule() -> None:
    pieces = ["/", ".", "..", "a", "b.", "%2e", "?x=/../"]
    checked = 0
    for size in range(1, 6):
        for parts in itertools.product(pieces, repeat=size):
            rest = "/" + "".join(parts)
            assert allowed(rest) == reference(rest), rest
            checked += 1
    assert checked == sum(len(pieces) ** size for size in range(1, 6))
