"""Warm restart: snapshot the router's statistics and health states to a local file.

A restarted sidecar that starts cold routes blind for a whole statistics
window and forgets which routes it had quarantined. So the serve loop writes
a snapshot periodically and on shutdown, and loads it on start.

File format (JSON, one object)::

    {"format": "tailroute-snapshot", "version": 1,
     "written_at": <wall-clock seconds since the epoch>,
     "stats": StatsStore.to_dict(now), "health": HealthBoard.to_dict(now),
     "transitions": [{"age": s, "cluster": ..., "slice": ..., ...}, ...],
     "pushback": [{"cluster": ..., "limit": L, "age": s since its last 429}, ...],
     "live": [{"cluster": ..., "slice": ..., "episodes": [age, ...],
               "last_missing": age}, ...]}

``pushback`` (optional: a file without it restores no learned limits) holds the
concurrency limits learned from providers' 429s (:mod:`sidecar.core.pushback`);
restored, each is clamped to its cluster's ``max_concurrency`` and keeps running
its quiet spell from its last refusal, so a restart neither forgets a provider's
quota nor holds it lower for longer than if the process had stayed up. ``live``
(optional too) holds each route's live-miss episodes, the repeat-offender memory of
``health.forgive_after_s`` (:mod:`sidecar.core.live_misses`), so a restart does not
hand a route that kept missing its budget its full share back.

Times inside the core are the event loop's monotonic clock, which means
nothing in another process, so the core stores them as *ages* relative to the
``now`` of the writer. The loader rebuilds them against ``now - gap``, where
``gap`` is the wall-clock time the file spent on disk: a sample that was 10 s
old when written and restored 20 s later is 30 s old, and a quarantine
cooldown keeps running while the sidecar is down.

A missing, stale, future-dated or corrupt snapshot is logged in one line and
ignored; loading never raises. Writing is atomic (temp file + rename), so a
crash mid-write leaves the previous snapshot intact; the temp file a crash left
behind is removed at the next start. The file is synced before the rename and
the directory after it, so a power loss keeps the old snapshot or the new.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import stat
import time
from pathlib import Path
from typing import Any, Final

from sidecar.core.fields import not_finite, shown
from sidecar.core.health_board import HealthBoard
from sidecar.core.router import Router
from sidecar.core.stats import StatsStore
from sidecar.core.steps import Steps, run_steps
from sidecar.core.types import SliceKey, TransitionEvent

log = logging.getLogger("tailroute.snapshot")

FORMAT = "tailroute-snapshot"
VERSION = 1
# Clocks of two hosts (or one host across an NTP step) may disagree a little;
# a file dated further in the future than this is not trusted.
_MAX_FUTURE_S = 60.0
_writes = itertools.count()  # numbers each write's temp file (write_text_atomic)
# Series built and encoded per step of encode_steps: about 1 ms each with a full ring
# (30 sub-windows of three histograms), so a step holds the loop for some 10 ms.
SERIES_PER_STEP: Final = 8


def build(router: Router, now: float, wall: float) -> dict[str, Any]:
    """The snapshot of ``router`` at loop time ``now`` / wall-clock time ``wall``."""
    return _document(router, now, wall, router.stats.to_dict(now))


def encode_steps(router: Router, now: float, wall: float) -> Steps[list[str]]:
    """``json.dumps(build(router, now, wall))`` as :func:`write_atomic` writes it, byte
    for byte, in pieces (for :func:`write_text_atomic`), pausing every
    :data:`SERIES_PER_STEP` series (:mod:`sidecar.core.steps`).

    The serve loop wrote its snapshot with :func:`build` at once and ``json.dumps`` in a
    worker thread, which keeps the GIL for the whole document: with 4,800 routes (16
    clusters, 100 models on 4 of them, 12 slices) the event loop stopped for 7.6-12 s per
    snapshot, every ``--snapshot-every``, and Envoy failed open every request it asked
    about meanwhile. Here each series is built and encoded in its own step; the rest
    (health states and the other small parts) is taken at the start, at once. Each
    series is JSON text as soon as it is read, so no copy of the whole state as
    Python objects is ever held either; nor is the text joined into one string
    (copying 48 MB a few times held the loop for 0.2 s at the end)."""
    stats = router.stats  # the store of the start, whatever a reload does meanwhile
    doc = _document(router, now, wall, stats.to_dict_head())
    series: list[str] = []
    for i, entry in enumerate(stats.series_dicts(now), 1):
        series.append(("," if series else "") + _dumps(entry))
        if i % SERIES_PER_STEP == 0:
            yield
    pieces = []
    for n, (key, value) in enumerate(doc.items()):
        pieces.append(f'{"," if n else "{"}{_dumps(key)}:{_dumps(value)}')
        if key == "stats":  # its last key, "series", follows its head
            pieces[-1] = pieces[-1][:-1] + ',"series":['
            pieces += series
            pieces.append("]}")
    pieces.append("}")
    return pieces


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _document(router: Router, now: float, wall: float,
              stats: dict[str, Any]) -> dict[str, Any]:
    transitions = [
        {"age": now - e.at, "cluster": e.cluster, "slice": e.slice, "old": e.old,
         "new": e.new, "reason": e.reason}
        for e in router.transitions
    ]  # fmt: skip
    return {
        "format": FORMAT,
        "version": VERSION,
        "written_at": wall,
        "stats": stats,
        "health": router.board.to_dict(now),
        "transitions": transitions,
        "pushback": [{"cluster": c, "limit": limit, "age": now - refused}
                     for c, (limit, refused) in sorted(router.pushback.learned().items())],
        "live": [{"cluster": c, "slice": s.label(), "episodes": [now - t for t in b.episodes],
                  "last_missing": now - b.last_missing}
                 for (c, s), b in router.live.books.items() if b.last_missing is not None],
    }


def write_atomic(path: str | Path, data: dict[str, Any]) -> int:
    """Write ``data`` as JSON to ``path`` (:func:`write_text_atomic`); returns bytes written."""
    return write_text_atomic(path, _dumps(data))


def write_text_atomic(path: str | Path, text: str | list[str]) -> int:
    """Write ``text`` (or its pieces, one after the other) to ``path`` via a temp file
    and rename, so readers see the old content or the new, never half of it; returns
    bytes written.

    fsync before the rename so a power loss cannot leave a renamed but empty file,
    and the directory after it (:func:`_sync_dir`) so it cannot undo the rename.
    Each write has its own temp file (``.<name>.<pid>.<n>.tmp``): the serve loop's
    shutdown snapshot may start while a periodic one is still being written in another
    thread, and with one name per process the second truncated the first's file under
    it, so one rename failed and the file could hold one write's bytes followed by the
    tail of the other's.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{next(_writes)}.tmp")
    try:
        with open(tmp, "wb") as f:
            for piece in [text] if isinstance(text, str) else text:
                size += f.write(piece.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
    _sync_dir(p.parent)
    return size


def _sync_dir(directory: Path) -> None:
    """fsync ``directory``: on POSIX a rename is a change of the directory's entries,
    which reach the disk with the directory, not with the file; until then a power
    loss can bring back the old snapshot, or none. Where a directory cannot be opened
    or synced (Windows; some network and FUSE file systems answer EINVAL), the rename
    has still happened and is as durable as that file system makes it: skip."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def save(router: Router, path: str | Path, now: float, wall: float | None = None) -> int:
    """Snapshot ``router`` to ``path`` (synchronously); returns bytes written."""
    wall = time.time() if wall is None else wall
    return write_text_atomic(path, run_steps(encode_steps(router, now, wall)))


def restore(router: Router, data: Any, now: float, wall: float | None = None) -> str:
    """Load a parsed snapshot into ``router``; returns a one-line summary.

    Raises ``ValueError`` naming the problem if the snapshot is unusable; the
    router is only modified once everything parsed, so a failure leaves it cold.
    """
    wall = time.time() if wall is None else wall
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a tailroute snapshot")
    if data.get("version") != VERSION:
        raise ValueError(f"unsupported format version {data.get('version')!r} "
                         f"(this build reads {VERSION})")
    if data.get("written_at") is None:
        raise ValueError("missing written_at timestamp")
    gap = wall - _number(data["written_at"], "written_at")
    limit = router.config.stats.stale_after_s
    if gap > limit:
        raise ValueError(f"stale: written {gap:.0f}s ago, older than stats.stale_after_s "
                         f"({limit:g}s)")
    if gap < -_MAX_FUTURE_S:
        raise ValueError(f"written {-gap:.0f}s in the future (clock skew?)")
    at = now - max(gap, 0.0)  # the writer's "now", on this process's loop clock
    known = set(router.config.cluster_names)
    stats_raw = dict(data.get("stats") or {})
    # Clusters removed from the config since the snapshot must not reappear in /state.
    stats_raw["series"] = [s for s in stats_raw.get("series", [])
                           if isinstance(s, dict) and s.get("cluster") in known]
    health_raw = {"routes": [r for r in (data.get("health") or {}).get("routes", [])
                             if isinstance(r, dict) and r.get("cluster") in known]}
    stats = StatsStore.from_dict(stats_raw, router.config.stats, at)
    board = HealthBoard.from_dict(health_raw, router.config.health, router.config.stats, at)
    transitions = _transitions(data.get("transitions", []), known, at)
    limits = _pushback(data.get("pushback", []), known, at)
    live = _live(data.get("live", []), known, at)
    router.restore(stats, board, list(transitions), now)
    for cluster, (limit, refused_at) in limits.items():
        router.pushback.adopt(cluster, limit, min(refused_at, now))
    for cluster, slice, episodes, last_missing in live:
        router.live.adopt(cluster, slice, episodes, last_missing)
    return (f"{len(stats_raw['series'])} series, {len(health_raw['routes'])} health states, "
            f"{len(limits)} learned concurrency limits, written {max(gap, 0.0):.0f}s ago")


def _number(raw: Any, what: str, low: float = -math.inf) -> float:
    """``raw`` if it is a finite number of at least ``low``, else ValueError naming ``what``.

    As a health time or a histogram count is checked: a NaN or an infinity restored
    would reach /state as a bare ``NaN`` token (not JSON) and be written back into
    every later snapshot; text, even "3", is no number a writer ever wrote.
    """
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"{what} is not a number: {shown(raw)}")
    problem = not_finite(raw)  # NaN, an infinity, an integer beyond a float's range
    if problem:
        raise ValueError(f"{what} {problem}")
    if raw < low:
        raise ValueError(f"{what} must be >= {low:g}, got {shown(raw)}")
    return float(raw)


def _transitions(raw: Any, known: set[str], at: float) -> list[TransitionEvent]:
    """The recent transitions of clusters still configured, dated on this process's
    clock (ValueError naming the first malformed entry, of any cluster)."""
    if not isinstance(raw, list):
        raise ValueError("malformed transitions: not a list")
    out: list[TransitionEvent] = []
    for i, t in enumerate(raw):
        try:
            age = _number(t["age"], "age", low=0.0)
            event = TransitionEvent(at - age, str(t["cluster"]), str(t["slice"]),
                                    str(t["old"]), str(t["new"]), str(t["reason"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed transitions[{i}]: {exc}") from None
        if event.cluster in known:
            out.append(event)
    return out


def _pushback(raw: Any, known: set[str], at: float) -> dict[str, tuple[float, float]]:
    """The learned limits of clusters still configured: ``cluster -> (limit, refused
    at)`` on this process's clock (ValueError naming the first malformed entry)."""
    if not isinstance(raw, list):
        raise ValueError("malformed pushback: not a list")
    out: dict[str, tuple[float, float]] = {}
    for i, e in enumerate(raw):
        try:
            cluster = e["cluster"]
            if not isinstance(cluster, str):
                raise TypeError(f"cluster must be a name, got {shown(cluster)}")
            limit, age = _number(e["limit"], "limit", low=1.0), _number(e["age"], "age", low=0.0)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed pushback[{i}]: {exc}") from None
        if cluster in known:  # one per cluster, so bounded by the config
            prev = out.get(cluster)
            out[cluster] = (limit, at - age) if prev is None else (
                min(prev[0], limit), max(prev[1], at - age))
    return out


def _live(raw: Any, known: set[str], at: float) -> list[tuple[str, SliceKey, list[float], float]]:
    """The live-miss memories of clusters still configured: ``(cluster, slice, episodes'
    beginnings, latest missing verdict)`` on this process's clock (ValueError naming the
    first malformed entry)."""
    if not isinstance(raw, list):
        raise ValueError("malformed live: not a list")
    out = []
    for i, e in enumerate(raw):
        try:
            cluster, slice = e["cluster"], SliceKey.parse(e["slice"])
            if not isinstance(cluster, str) or not isinstance(e["episodes"], list):
                raise TypeError("cluster must be a name and episodes a list")
            ages = sorted((_number(a, "episode age", low=0.0) for a in e["episodes"]),
                          reverse=True)  # oldest first, as the book keeps them
            last = _number(e["last_missing"], "last_missing age", low=0.0)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed live[{i}]: {exc}") from None
        if cluster in known:
            out.append((cluster, slice, [at - a for a in ages], at - last))
    return out


def sweep_temps(path: str | Path) -> list[Path]:
    """Remove the temp files of :func:`write_text_atomic` next to ``path`` whose writer
    is dead; returns them. A writer killed between its write and its rename left
    ``.<name>.<pid>.<n>.tmp`` behind, and each restart has another pid, so a crash loop
    filled the directory with copies of the snapshot. A live writer's file (this
    process, a sibling worker) stays; so does any file this cannot judge."""
    p = Path(path)
    removed: list[Path] = []
    try:
        found = list(p.parent.glob(f".{p.name}.*.tmp"))
    except OSError:
        return removed
    for tmp in found:
        # ``<pid>.<n>``, or ``<pid>`` alone as builds before the write counter named it
        pid = tmp.name[len(p.name) + 2:-len(".tmp")].partition(".")[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            tmp.unlink()
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM), or a pid beyond the range
        return True
    return True


def load(router: Router, path: str | Path, now: float, wall: float | None = None) -> bool:
    """Warm-start ``router`` from ``path``; logs one line and returns False if unusable.

    Never raises: a sidecar that cannot read its snapshot must still start (cold).
    A dead writer's temp files next to it are removed first (:func:`sweep_temps`).
    """
    p = Path(path)
    if swept := sweep_temps(p):
        log.info("removed %d temp file(s) of an interrupted snapshot write: %s",
                 len(swept), ", ".join(t.name for t in swept[:3]))
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            # A FIFO blocked the start for good (no log line, never ready); /dev/zero
            # would be read until memory ran out. A directory fails to open anyway.
            log.warning("snapshot %s ignored (not a regular file); starting cold", p)
            return False
        raw = p.read_bytes()
    except FileNotFoundError:
        log.info("no snapshot at %s; starting cold", p)
        return False
    except OSError as exc:
        log.warning("snapshot %s ignored (cannot read: %s); starting cold", p, exc.strerror or exc)
        return False
    try:
        data = json.loads(raw)
        summary = restore(router, data, now, wall)
    # JSONDecodeError is a ValueError. ArithmeticError: a number no writer writes (an
    # integer beyond a float, an accuracy that divides by zero) met deep in restore.
    except (ValueError, UnicodeDecodeError, ArithmeticError) as exc:
        log.warning("snapshot %s ignored (%s); starting cold", p, exc)
        return False
    except Exception as exc:  # a bug in a from_dict must not stop the sidecar starting
        log.warning("snapshot %s ignored (unexpected %r); starting cold", p, exc)
        return False
    log.info("warm start from snapshot %s: %s", p, summary)
    return True
