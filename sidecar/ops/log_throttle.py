"""Rate-limited warnings: a logging filter that says how many lines it swallowed.

One malformed message per request must not become one log line per request
(a fuzz run once wrote 1,423 identical warnings). Records at WARNING and above
are limited per *call site* — logger name plus the unformatted message
template, so "unexpected %s in phase %s" is one key whatever its arguments —
by a token bucket: ``burst`` lines at once, then one per ``every_s`` seconds.
The first line let through after a suppression carries the count::

    unexpected request_body in phase routed [312 similar lines suppressed in 41.0 s]

:meth:`LogThrottle.flush` reports counts still pending (call it at shutdown),
so a burst that ends is never silently lost. INFO and DEBUG pass untouched.
Keys are bounded (templates come from code, but a bug formatting messages
itself must not grow memory): past ``max_keys`` the stalest key is forgotten.
A record logged with ``extra=UNTHROTTLED`` always passes: an operator's own
action, such as a rejected reload, gets its line however often it comes.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

# ``logger.error(..., extra=UNTHROTTLED)``: a line an operator's own action causes (a
# rejected config reload: one per edit or SIGHUP), which no request can multiply.
UNTHROTTLED: Final = {"unthrottled": True}

# The loggers of the serving process (ext_proc shell, server, ops).
SERVING_LOGGERS = ("tailroute", "tailroute.extproc", "tailroute.server", "tailroute.admin",
                   "tailroute.reload", "tailroute.health", "tailroute.tls")


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    suppressed: int = 0
    since: float = 0.0  # when the first suppressed line of the current run came
    # The newest suppressed line's arguments, formatted only if flush() reports it
    # (a flood is exactly when formatting every dropped line would cost the most).
    last: Any = None


class LogThrottle(logging.Filter):
    """Token bucket per (logger, template) for records at ``level`` and above."""

    def __init__(self, burst: int = 5, every_s: float = 10.0, level: int = logging.WARNING,
                 max_keys: int = 512, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.every_s = every_s
        self.level = level
        self.max_keys = max_keys
        self.clock = clock
        self.suppressed_total = 0
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()
        self._loggers: dict[tuple[str, str], logging.Logger] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno < self.level or getattr(record, "throttle_summary", False)
                or getattr(record, "unthrottled", False)):
            return True
        key = (record.name, str(record.msg))
        now = self.clock()
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(float(self.burst), now)
            while len(self._buckets) > self.max_keys:
                old, _ = self._buckets.popitem(last=False)
                self._loggers.pop(old, None)
        else:
            self._buckets.move_to_end(key)
            b.tokens = min(float(self.burst), b.tokens + (now - b.at) / self.every_s)
            b.at = now
        if b.tokens < 1.0:
            if b.suppressed == 0:
                b.since = now
            b.suppressed += 1
            self.suppressed_total += 1
            # The newest one, for flush(): same template, maybe other facts (ENOSPC then
            # EROFS), and a bare template says neither.
            b.last = record.args
            self._loggers.setdefault(key, logging.getLogger(record.name))
            return False
        b.tokens -= 1.0
        if b.suppressed:
            record.msg = f"{record.msg} [{_note(b.suppressed, now - b.since)}]"
            b.suppressed = 0
        return True

    def flush(self) -> int:
        """Log one line per key with suppressed lines pending; return how many were pending."""
        now = self.clock()
        pending = 0
        for key, b in list(self._buckets.items()):
            if not b.suppressed:
                continue
            pending += b.suppressed
            name, template = key
            logger = self._loggers.get(key) or logging.getLogger(name)
            n, took = b.suppressed, now - b.since
            b.suppressed = 0
            last = _formatted(template, b.last)
            text = f"{last} [{_note(n, took)}; the last of them shown]"
            logger.handle(logger.makeRecord(
                name, logging.WARNING, "(throttle)", 0, "%s", (text,),
                None, extra={"throttle_summary": True}))  # not throttled itself
        return pending


def _formatted(template: str, args: Any) -> str:
    """``template % args`` as logging would format it; the template if that fails."""
    if not args:
        return template
    try:
        return str(template % args)
    except (TypeError, ValueError, KeyError):
        return template


def _note(n: int, took_s: float) -> str:
    return f"{n} similar line{'s' if n != 1 else ''} suppressed in {took_s:.1f} s"


def install(loggers: Iterable[str] = SERVING_LOGGERS,
            throttle: LogThrottle | None = None) -> LogThrottle:
    """Attach one shared throttle to each named logger (filters do not propagate)."""
    throttle = throttle or LogThrottle()
    for name in loggers:
        logging.getLogger(name).addFilter(throttle)
    return throttle


def uninstall(throttle: LogThrottle, loggers: Iterable[str] = SERVING_LOGGERS) -> None:
    for name in loggers:
        logging.getLogger(name).removeFilter(throttle)
