"""Which outbound proxy the environment sets for a URL (HTTPS_PROXY, NO_PROXY).

aiohttp applies the proxy itself (``trust_env``); this module only tells the
agent whether one is in use, to explain TLS failures precisely.
"""

from __future__ import annotations

import urllib.request
from urllib.parse import urlsplit, urlunsplit

__all__ = ["proxy_for", "redact_url"]


def proxy_for(url: str) -> str | None:
    """The proxy URL the environment sets for ``url``, credentials removed, or None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if urllib.request.proxy_bypass(host):
        return None
    proxies = urllib.request.getproxies_environment()
    # aiohttp uses the scheme's proxy only (not ALL_PROXY); say what it does.
    proxy = proxies.get(parts.scheme)
    return redact_url(proxy) if proxy else None


def redact_url(url: str) -> str:
    """``url`` without any user name or password in it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
