"""Lifetime fraction and time checks (tunnel_pki.validity)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from tunnel_pki.errors import InvalidValidityError
from tunnel_pki.validity import certificate_lifetime_fraction, require_aware, require_positive

START = datetime(2030, 1, 1, tzinfo=UTC)
END = START + timedelta(days=10)


@pytest.mark.parametrize(
    ("now", "fraction"),
    [
        (START, 0.0),
        (START + timedelta(days=1), 0.1),
        (START + timedelta(days=5), 0.5),
        (START + timedelta(days=7, hours=12), 0.75),
        (END, 1.0),
    ],
)
def test_lifetime_fraction_is_the_share_of_the_period_passed(
    now: datetime, fraction: float
) -> None:
    assert certificate_lifetime_fraction(START, END, now) == pytest.approx(fraction)


def test_lifetime_fraction_is_clamped_outside_the_period() -> None:
    assert certificate_lifetime_fraction(START, END, START - timedelta(days=1)) == 0.0
    assert certificate_lifetime_fraction(START, END, END + timedelta(days=100)) == 1.0


def test_lifetime_fraction_of_an_empty_or_inverted_period_is_used_up() -> None:
    assert certificate_lifetime_fraction(START, START, START) == 1.0
    assert certificate_lifetime_fraction(END, START, START) == 1.0


def test_lifetime_fraction_compares_across_timezones() -> None:
    plus_two = timezone(timedelta(hours=2))
    half = (START + timedelta(days=5)).astimezone(plus_two)
    assert certificate_lifetime_fraction(START, END.astimezone(plus_two), half) == 0.5


def test_lifetime_fraction_refuses_naive_times() -> None:
    naive = datetime(2030, 1, 5)
    with pytest.raises(InvalidValidityError, match="now must be a timezone-aware"):
        certificate_lifetime_fraction(START, END, naive)
    with pytest.raises(InvalidValidityError, match="not_before"):
        certificate_lifetime_fraction(naive, END, START)


def test_require_aware_converts_to_utc() -> None:
    moment = datetime(2030, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    assert require_aware(moment) == START
    assert require_aware(moment).tzinfo is UTC


def test_require_positive_refuses_zero_negative_and_non_timedelta() -> None:
    assert require_positive(timedelta(seconds=1)) == timedelta(seconds=1)
    for bad in (timedelta(0), timedelta(seconds=-1), 3600):
        with pytest.raises(InvalidValidityError):
            require_positive(bad)  # type: ignore[arg-type]
