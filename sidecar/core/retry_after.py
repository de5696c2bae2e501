"""How long a rate-limited provider asked to be left alone: a 429's declared wait (pure).

Providers say it in one of two headers:

* ``retry-after-ms`` -- milliseconds (Azure OpenAI and OpenAI; fractions occur);
* ``retry-after`` -- RFC 9110 section 10.2.3: *delta-seconds* (digits) or an HTTP-date.

:func:`parse_retry_after` reads them, first match wins:

====  ===================================================  =================================
rank  header value                                         wait (seconds)
====  ===================================================  =================================
1     ``retry-after-ms``: a non-negative decimal number    the number / 1000
2     ``retry-after``: digits, or a decimal number         the number (some providers send
                                                           ``1.5`` although the RFC allows
                                                           digits only)
3     ``retry-after``: an HTTP-date (IMF-fixdate, or the   the date minus the response's
      RFC 850 and asctime forms the RFC still accepts)     ``date`` header; without a
                                                           readable one, minus ``now_epoch``;
                                                           a date already past: 0
-     anything else: negative, ``nan``, ``inf``,           None (no wait declared)
      exponents, text, a value over 64 characters
====  ===================================================  =================================

A wait is capped at :data:`MAX_WAIT_S` (a day; push-back caps it further). An
unreadable ``retry-after-ms`` does not hide a readable ``retry-after``. Leading
and trailing whitespace is ignored; nothing here raises, whatever the text.

The wall clock is the caller's (``now_epoch``): the core never reads one.
"""

from __future__ import annotations

import calendar
import math
import re
from email.utils import parsedate_tz
from typing import Final

MAX_WAIT_S: Final = 86400.0
# Longer values are not a number or a date anyone sends (an IMF-fixdate is 29
# characters); refusing them first bounds the work hostile text can cause.
MAX_VALUE_CHARS: Final = 64
# Plain decimal numbers only: float() would also take "nan", "inf", "1e9", "1_000"
# and non-ASCII digits.
_NUMBER: Final = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)


def parse_retry_after(retry_after: str | None, retry_after_ms: str | None,
                      date: str | None, now_epoch: float | None) -> float | None:
    """The declared wait in seconds, within [0, :data:`MAX_WAIT_S`], or None (module
    docstring). ``date`` is the response's ``date`` header; ``now_epoch`` the wall
    time (seconds since the epoch) to measure an HTTP-date against without one."""
    ms = _number(retry_after_ms)
    if ms is not None:
        return _clamp(ms / 1000.0)
    if retry_after is None:
        return None
    seconds = _number(retry_after)
    if seconds is not None:
        return _clamp(seconds)
    until = http_date_epoch(retry_after)
    if until is None:
        return None
    since = http_date_epoch(date) if date is not None else None
    if since is None:
        since = now_epoch
    if since is None or not math.isfinite(since):
        return None
    return _clamp(max(until - since, 0.0))


def _number(text: str | None) -> float | None:
    """A non-negative plain decimal number (surrounding whitespace allowed), else None."""
    if text is None or len(text) > MAX_VALUE_CHARS:
        return None
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)  # at most 64 digits: finite
    return value if math.isfinite(value) else None


def http_date_epoch(text: str) -> float | None:
    """An HTTP-date as seconds since the epoch (None: not one). The RFC's dates are
    all GMT: a form without a zone (asctime) is read as GMT, never as local time."""
    if len(text) > MAX_VALUE_CHARS:
        return None
    try:
        parts = parsedate_tz(text.strip())
        if parts is None:
            return None
        offset = parts[9] or 0
        return float(calendar.timegm(parts[:6]) - offset)
    except (ValueError, TypeError, IndexError, OverflowError):
        return None  # a day or year no calendar has


def _clamp(wait: float) -> float:
    return min(wait, MAX_WAIT_S)
