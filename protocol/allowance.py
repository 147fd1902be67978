"""How many frames that carry no data a peer may send: its allowance.

Most frames cost the receiver more than their few bytes: a WINDOW, a PING, a
RESET, an OPEN, or a DATA frame with neither payload nor END is five to
twenty bytes on the wire and a quarter of a microsecond or more to handle
(an OPEN, with its handler task, forty), about a thousand times a DATA
frame's cost per byte. A peer that sends nothing else (a compromised agent,
say) could keep the other side's one event loop busy, and every other
connection waiting, with a few MB/s.

A well-behaved peer sends such frames in answer to what this side does: a
WINDOW for the data this side sent, a PONG for its PING, a RESET or WINDOW on
a stream this side opened, an OPEN that this side answers with data, a PING
every second at most. So the allowance grows with what this side sends, and
with time, and each such frame spends one (docs/protocol.md, "Frames without
data"); a peer that spends past it is a connection error EXCESSIVE_LOAD.
HTTP/2 servers guard the same way against "empty frame", "control frame" and
"rapid reset" floods (CVE-2019-9518, CVE-2019-9512, CVE-2023-44487).
"""

from __future__ import annotations

from .errors import ExcessiveLoadError

__all__ = [
    "ALLOWANCE_CAP",
    "ALLOWANCE_PER_SECOND",
    "ALLOWANCE_START",
    "FRAME_ENVELOPE",
    "ControlAllowance",
]

#: Frames a peer may send before this side has sent anything.
ALLOWANCE_START = 10_000
#: The most a peer may save up: what it may spend in one burst.
ALLOWANCE_CAP = 100_000
#: Bytes of a message that are neither DATA payload nor this much per frame
#: (the maps of OPENs and MESSAGEs) spend one per KiB.
FRAME_ENVELOPE = 16
#: What time adds, per second (its own PINGs and MESSAGEs, requests given up unanswered).
ALLOWANCE_PER_SECOND = 100


class ControlAllowance:
    """The frames without data the peer may still send; spent and earned by the connection."""

    __slots__ = ("enforced", "since", "tokens")

    def __init__(self) -> None:
        self.tokens = ALLOWANCE_START
        #: When time last added to it; set when the handshake completes.
        self.since: float | None = None
        #: False: counted, never enforced (``Connection(enforce_allowance=False)``).
        self.enforced = True

    def earn(self, amount: int) -> None:
        """This side did something a peer may answer with ``amount`` such frames."""
        tokens = self.tokens + amount
        self.tokens = tokens if tokens < ALLOWANCE_CAP else ALLOWANCE_CAP

    def spend(self, now: float, amount: int = 1) -> None:
        """The peer sent such frames; raises :class:`ExcessiveLoadError` past the allowance."""
        self.tokens -= amount
        if self.tokens < 0:
            self._replenish(now)

    def _replenish(self, now: float) -> None:
        since = self.since
        if since is not None and now > since:
            gained = int((now - since) * ALLOWANCE_PER_SECOND)
            if gained > 0:
                self.earn(gained)
                # Keep the fraction: a peer just under the rate is never cut.
                self.since = since + gained / ALLOWANCE_PER_SECOND
        if self.tokens < 0:
            self.tokens = 0  # a peer that answers the error is not failed twice
            if not self.enforced:
                return
            raise ExcessiveLoadError(
                "the peer sent more frames without data (WINDOW, PING, PONG, RESET, GOAWAY, "
                "MESSAGE, OPEN, empty DATA) than this side's traffic accounts for: "
                "a flood, or a peer that is not well behaved"
            )
