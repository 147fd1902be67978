"""Validity periods: timezone-aware times, clock skew, and how much of a lifetime is used.

Time enters as a ``now`` argument, as in the protocol core, so that callers
and tests decide what the clock says.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tunnel_pki.errors import InvalidValidityError

__all__ = [
    "CLOCK_SKEW",
    "certificate_lifetime_fraction",
    "require_aware",
    "require_positive",
]

CLOCK_SKEW = timedelta(minutes=5)
"""How far before ``now`` an issued certificate starts, for peers whose clocks run behind."""


def require_aware(moment: datetime, what: str = "now") -> datetime:
    """Return ``moment`` in UTC; raise :class:`InvalidValidityError` if it has no timezone."""
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise InvalidValidityError(
            f"{what} must be a timezone-aware datetime, e.g. datetime.now(UTC)"
        )
    return moment.astimezone(UTC)


def require_positive(lifetime: timedelta) -> timedelta:
    """Return ``lifetime``; raise :class:`InvalidValidityError` unless it is positive."""
    if not isinstance(lifetime, timedelta) or lifetime <= timedelta(0):
        raise InvalidValidityError(
            f"certificate lifetime must be a positive timedelta, not {lifetime!r}"
        )
    return lifetime


def certificate_lifetime_fraction(
    not_before: datetime, not_after: datetime, now: datetime
) -> float:
    """Return how much of the validity period has passed at ``now``, from 0.0 to 1.0.

    Before ``not_before`` it is 0.0, from ``not_after`` on it is 1.0; an empty
    or inverted period counts as used up. The agent renews its certificate
    when this reaches one half. All three times must be timezone-aware.
    """
    start = require_aware(not_before, "not_before")
    end = require_aware(not_after, "not_after")
    moment = require_aware(now)
    if end <= start:
        return 1.0
    fraction = (moment - start) / (end - start)
    return min(1.0, max(0.0, fraction))
