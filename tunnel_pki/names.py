"""Names the certificates carry: cluster names, server host names, the cluster URI.

A cluster name is what the server files an agent under and what an agent's
client certificate proves, so the server and the agent validate it the same
way, here. It is DNS-label-like so that it is safe in URLs, log lines, file
names and Kubernetes object names alike.
"""

from __future__ import annotations

import re

from tunnel_pki.errors import InvalidNameError, shorten

__all__ = [
    "AGENT_ORGANIZATION",
    "CLUSTER_URI_PREFIX",
    "MAX_CLUSTER_NAME_LENGTH",
    "REPLICA_ORGANIZATION",
    "REPLICA_URI_PREFIX",
    "cluster_from_uri",
    "cluster_uri",
    "replica_from_uri",
    "replica_uri",
    "validate_cluster_name",
    "validate_dns_name",
]

MAX_CLUSTER_NAME_LENGTH = 63
"""The longest cluster name: one DNS label (RFC 1035, section 2.3.4)."""

CLUSTER_URI_PREFIX = "urn:tunnel:cluster:"
"""An agent certificate names its cluster in a URI SAN: this prefix, then the cluster name."""

AGENT_ORGANIZATION = "tunnel-agent"
"""The subject organization (O) of every agent certificate."""

REPLICA_URI_PREFIX = "urn:tunnel:replica:"
"""A server replica's certificate names the replica in a URI SAN: this prefix, then its name."""

REPLICA_ORGANIZATION = "tunnel-server-replica"
"""The subject organization (O) of every replica certificate."""

# [a-z0-9] spelled out rather than \w so that no Unicode letter or digit slips in.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_CLUSTER_RE = re.compile(_LABEL)
_DNS_RE = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")
_MAX_DNS_NAME_LENGTH = 253


def validate_cluster_name(name: str) -> str:
    """Return ``name`` if it is a valid cluster name, else raise :class:`InvalidNameError`.

    A cluster name is 1 to 63 characters of lowercase ``a-z``, ``0-9`` and
    ``-``, starting and ending with a letter or a digit.
    """
    if not isinstance(name, str) or _CLUSTER_RE.fullmatch(name) is None:
        raise InvalidNameError(
            f"invalid cluster name {shorten(name)}: use 1 to {MAX_CLUSTER_NAME_LENGTH} "
            "characters of lowercase a-z, 0-9 and '-', starting and ending with a letter or digit"
        )
    return name


def validate_dns_name(name: str) -> str:
    """Return ``name`` in lowercase if it is a valid DNS name for a server certificate.

    Labels follow :func:`validate_cluster_name`'s rule (case aside), the whole
    name is at most 253 characters, its last label is not all digits, and a
    leading ``*.`` wildcard is allowed.
    Internationalised names must be given in their ``xn--`` form. Raises
    :class:`InvalidNameError` otherwise.
    """
    # isascii() before lower(): some non-ASCII letters lower to ASCII ones (KELVIN SIGN -> k).
    if (
        not isinstance(name, str)
        or not name.isascii()
        or len(name) > _MAX_DNS_NAME_LENGTH
        or _DNS_RE.fullmatch(name.lower()) is None
        # A name ending in a numeric label is an IP address gone wrong (RFC 1123, section 2.1).
        or name.rsplit(".", 1)[-1].isdigit()
    ):
        raise InvalidNameError(
            f"invalid host name {shorten(name)}: use an IP address or a DNS name of "
            "dot-separated labels of a-z, 0-9 and '-' (an optional leading '*.' is allowed)"
        )
    return name.lower()


def cluster_uri(cluster: str) -> str:
    """Return the URI SAN that names ``cluster`` in an agent certificate."""
    return CLUSTER_URI_PREFIX + validate_cluster_name(cluster)


def cluster_from_uri(uri: str) -> str | None:
    """Return the cluster a URI SAN names, or None if it is not a cluster URI.

    Raises :class:`InvalidNameError` when the URI has the cluster prefix but
    the name after it is not a valid cluster name.
    """
    if not uri.startswith(CLUSTER_URI_PREFIX):
        return None
    return validate_cluster_name(uri[len(CLUSTER_URI_PREFIX) :])


def replica_uri(replica: str) -> str:
    """The URI SAN that names a server replica (a name of the same form as a cluster's)."""
    return REPLICA_URI_PREFIX + validate_cluster_name(replica)


def replica_from_uri(uri: str) -> str | None:
    """The replica a ``urn:tunnel:replica:`` URI names; None for another URI.

    Raises :class:`InvalidNameError` if it has the prefix but not a valid name.
    """
    if not uri.startswith(REPLICA_URI_PREFIX):
        return None
    return validate_cluster_name(uri[len(REPLICA_URI_PREFIX) :])
