"""The handshake: this side's HELLO, and what the two HELLOs agree on.

Each side's first frame is a HELLO with the protocol versions it speaks, its
limits, its capabilities and an info map; the two HELLOs cross
(docs/protocol.md, "Handshake"). :func:`hello_frame` builds this side's and
refuses, with ``ValueError``, one the peer could not accept (docs/protocol.md,
"HELLO (1)"). :func:`negotiate` is what each side computes on its own when the
peer's arrives: the highest version both speak, or a refusal, and the
capabilities both name ("Versioning").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .checks import checked_size
from .errors import UnsupportedVersionError
from .frames import MAX_CAPABILITIES, MAX_KIND_LENGTH, HelloFrame, encode_message
from .limits import MIN_FRAME_SIZE, Limits

__all__ = ["hello_frame", "negotiate"]


def hello_frame(
    versions: tuple[int, int],
    limits: Limits,
    capabilities: Iterable[str],
    info: Mapping[str, Any] | None,
) -> tuple[HelloFrame, int]:
    """This side's HELLO and its encoded size (its first message must fit a minimal frame)."""
    low, high = versions
    if not 0 < low <= high < 2**16:
        raise ValueError("versions must be (min, max) with 1 <= min <= max <= 65535")
    names = frozenset(capabilities)
    if len(names) > MAX_CAPABILITIES or not all(
        type(name) is str and len(name) <= MAX_KIND_LENGTH for name in names
    ):
        raise ValueError(
            f"capabilities must be at most {MAX_CAPABILITIES} names "
            f"of at most {MAX_KIND_LENGTH} characters"
        )
    info_map = dict(info or {})
    checked_size(info_map)
    hello = HelloFrame(low, high, limits, names, info_map)
    size = len(encode_message([hello]))
    if size > MIN_FRAME_SIZE:
        raise ValueError(f"HELLO of {size} bytes is too large; shorten the info map")
    return hello, size


def negotiate(
    versions: tuple[int, int], capabilities: frozenset[str], peer: HelloFrame
) -> tuple[int, frozenset[str]]:
    """The version and the capabilities this side and the peer of ``peer`` share."""
    low, high = versions
    version = min(high, peer.max_version)
    if version < max(low, peer.min_version):
        raise UnsupportedVersionError(
            f"no protocol version in common: this side speaks {low}-{high}, the peer "
            f"{peer.min_version}-{peer.max_version}; upgrade the older side"
        )
    return version, capabilities & peer.capabilities
