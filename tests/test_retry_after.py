"""A 429's declared wait, read from Retry-After / retry-after-ms (sidecar.core.retry_after)."""

from __future__ import annotations

import calendar
import email.utils

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.retry_after import MAX_WAIT_S, http_date_epoch, parse_retry_after

# Wed, 21 Oct 2015 07:28:00 GMT
T = float(calendar.timegm((2015, 10, 21, 7, 28, 0)))
FIXDATE = "Wed, 21 Oct 2015 07:28:00 GMT"


@pytest.mark.parametrize(("retry_after", "retry_after_ms", "date", "now", "want"), [
    # delta-seconds
    ("120", None, None, None, 120.0),
    ("0", None, None, None, 0.0),
    ("  7 \t", None, None, None, 7.0),
    ("1.5", None, None, None, 1.5),  # not RFC, but providers send it
    (".5", None, None, None, 0.5),
    ("3.", None, None, None, 3.0),
    ("999999999999", None, None, None, MAX_WAIT_S),  # capped at a day
    # retry-after-ms wins when it is readable
    ("120", "250", None, None, 0.25),
    (None, "1500.5", None, None, 1.5005),
    ("9", "0", None, None, 0.0),
    # ... and an unreadable one does not hide retry-after
    ("4", "soon", None, None, 4.0),
    ("4", "-5", None, None, 4.0),
    ("4", "nan", None, None, 4.0),
    ("4", "inf", None, None, 4.0),
    ("4", "1e3", None, None, 4.0),
    ("4", "", None, None, 4.0),
    # HTTP-date against the response's date header, else the caller's wall time
    (FIXDATE, None, "Wed, 21 Oct 2015 07:27:30 GMT", None, 30.0),
    (FIXDATE, None, None, T - 45, 45.0),
    (FIXDATE, None, "garbage", T - 10, 10.0),  # unreadable date header: wall time
    (FIXDATE, None, "Wed, 21 Oct 2015 07:27:30 GMT", T + 999, 30.0),  # date wins
    ("Wednesday, 21-Oct-15 07:28:00 GMT", None, None, T - 5, 5.0),  # RFC 850
    ("Wed Oct 21 07:28:00 2015", None, None, T - 5, 5.0),  # asctime: GMT, not local
    (FIXDATE, None, None, T + 60, 0.0),  # already past
    (FIXDATE, None, None, T - 10 * MAX_WAIT_S, MAX_WAIT_S),
    (FIXDATE, None, None, None, None),  # nothing to measure against
    (FIXDATE, None, None, float("nan"), None),
    # garbage
    (None, None, None, None, None),
    ("-5", None, None, 0.0, None),
    ("soon", None, None, 0.0, None),
    ("nan", None, None, 0.0, None),
    ("inf", None, None, 0.0, None),
    ("1e3", None, None, 0.0, None),
    ("1_000", None, None, 0.0, None),
    ("\u0664\u0662", None, None, 0.0, None),  # Arabic-Indic digits
    ("", None, None, 0.0, None),
    ("1" * 65, None, None, 0.0, None),  # absurd length
    ("Wed, 21 Oct 99999 07:28:00 GMT", None, None, 0.0, None),  # no such year
    ("Wed, 32 Foo 2015 07:28:00 GMT", None, None, 0.0, None),
])
def test_parse_retry_after(retry_after: str | None, retry_after_ms: str | None,
                           date: str | None, now: float | None, want: float | None) -> None:
    got = parse_retry_after(retry_after, retry_after_ms, date, now)
    assert got == (pytest.approx(want) if want is not None else None)


_TEXT = st.one_of(st.none(), st.text(max_size=80),
                  st.from_regex(r"\s*-?[0-9.]{0,20}\s*", fullmatch=True))


@given(_TEXT, _TEXT, _TEXT, st.one_of(st.none(), st.floats()))
def test_never_raises_and_stays_in_range(retry_after: str | None, retry_after_ms: str | None,
                                         date: str | None, now: float | None) -> None:
    got = parse_retry_after(retry_after, retry_after_ms, date, now)
    assert got is None or 0.0 <= got <= MAX_WAIT_S


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["", " ", "\t"]))
def test_delta_seconds_round_trip(seconds: int, pad: str) -> None:
    assert parse_retry_after(f"{pad}{seconds}{pad}", None, None, None) == min(seconds, MAX_WAIT_S)


@given(st.integers(min_value=0, max_value=10**9), st.one_of(st.none(), st.text(max_size=30)))
def test_readable_ms_wins(ms: int, retry_after: str | None) -> None:
    assert parse_retry_after(retry_after, str(ms), None, 0.0) == min(ms / 1000, MAX_WAIT_S)


@given(st.integers(min_value=0, max_value=253402300799))  # up to 9999-12-31
def test_http_date_round_trip(epoch: int) -> None:
    assert http_date_epoch(email.utils.formatdate(epoch, usegmt=True)) == epoch
