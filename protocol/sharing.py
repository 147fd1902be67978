"""How much credit a receiver keeps a stream near while streams share the connection.

Every byte a stream has in flight queues, on the one connection, in front of
every other stream's bytes. A download holding a megabyte of credit makes a
small answer that follows it wait for that megabyte: at a few hundred MB/s,
several milliseconds, on a link whose round trip is a fraction of one. So
while other streams are active, the reference receiver keeps each stream's
credit near a smaller *shared target*, and gives the whole window back once
the stream has had the connection to itself for a while (docs/protocol.md,
"Sharing the connection").

The shared target is what a stream needs in flight to keep ``shared_rate``
over the smallest round trip measured on the connection, but never less than
``shared_window`` and never more than the window. On a short link that is
``shared_window``, whose bytes drain in well under a millisecond; on a long
one (64 MiB/s over 50 ms is 3.4 MB) it is the whole window: there, bytes in
flight are on the wire rather than queued, and holding them back would only
slow the transfer.

"A while" is measured in bytes received on the connection, not in seconds, so
nothing here reads a clock; it also means the span does not expire with idle
time (the first ``shared_span`` bytes of a download that follows any other
request are received as shared).
"""

from __future__ import annotations

from .limits import Limits

__all__ = ["NEVER", "RecentStreams", "SharedCredit"]

#: The mark of an activity that never happened: further back than any span.
NEVER = -(2**62)


class RecentStreams:
    """The latest activity of the last active stream and of the one before it.

    Two slots are enough to answer "when was a stream *other than s* last
    active?" for any ``s``: if ``s`` is the last active stream, the answer is
    the moment the stream before it last was; otherwise it is the last mark.
    """

    __slots__ = ("last_id", "last_mark", "previous_mark")

    def __init__(self) -> None:
        self.last_id = 0  # no stream has id 0
        self.last_mark = NEVER
        self.previous_mark = NEVER

    def touch(self, stream_id: int, mark: int) -> None:
        """Stream ``stream_id`` was active at ``mark`` (bytes received so far)."""
        if stream_id != self.last_id:
            self.previous_mark = self.last_mark
            self.last_id = stream_id
        self.last_mark = mark

    def others_since(self, stream_id: int) -> int:
        """The mark of the latest activity of any stream but ``stream_id``."""
        return self.previous_mark if stream_id == self.last_id else self.last_mark


class SharedCredit:
    """A receiver's stream credit targets: the window alone, a shared target otherwise."""

    __slots__ = (
        "_floor",
        "_rate",
        "_span",
        "min_rtt",
        "recent",
        "shared_target",
        "shared_threshold",
        "threshold",
        "window",
    )

    def __init__(self, limits: Limits) -> None:
        #: The stream target when a stream has the connection to itself.
        self.window = limits.initial_window
        self.threshold = max(1, self.window // 4)
        #: The shared target, and the shortfall at which credit is returned.
        self._floor = min(limits.shared_window, self.window)
        self.shared_target = self._floor
        self.shared_threshold = max(1, self.shared_target // 4)
        #: Smallest round trip measured on the connection (seconds), once one is.
        self.min_rtt: float | None = None
        self.recent = RecentStreams()
        self._span = limits.shared_span
        self._rate = limits.shared_rate

    def target(self, stream_id: int, received: int) -> tuple[int, int]:
        """A stream's credit target and threshold, ``received`` bytes into the connection."""
        if received - self.recent.others_since(stream_id) < self._span:
            return self.shared_target, self.shared_threshold
        return self.window, self.threshold

    def rtt_measured(self, rtt: float) -> None:
        """A PING's round trip came back: the shared target may grow with the link."""
        if self.min_rtt is not None and rtt >= self.min_rtt:
            return
        self.min_rtt = rtt
        self.shared_target = min(max(int(self._rate * rtt), self._floor), self.window)
        self.shared_threshold = max(1, self.shared_target // 4)
