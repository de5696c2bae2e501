"""Hot config reload: on SIGHUP and when the config file changes on disk.

The watcher polls the file's (mtime, size, content hash) about once a second:
no inotify dependency, and it also sees Kubernetes ConfigMap updates, which
swap a symlink rather than write the file. A change is acted on once the
fingerprint is the same on two consecutive polls, so an editor caught halfway
through writing does not count as an invalid config. SIGHUP reloads at once.

A valid file is swapped in with ``Router.reload`` (statistics and health are
kept; statistics start afresh on a new ``stats.subwindow_s``, said in a warning and
counted: ``tailroute_config_stats_resets_total``); an invalid one -- whatever is
wrong with it: not UTF-8, not YAML, a wrong field -- leaves the last good config
serving, is logged on one line (the :class:`ConfigError` names the file and the
field) and is counted, so
``tailroute_config_reloads_total{result="invalid"}`` and
``tailroute_config_last_reload_ok == 0`` show it, and so does /state ``config``
(:meth:`ConfigReloader.view`, with the error); the watcher goes on. A file
that would give Envoy other routes (a cluster or class added or removed, a class
timeout or the default route moved) is refused the same way: Envoy cannot
reload its bootstrap from here (:mod:`sidecar.ops.envoy_drift`).

The file is read and parsed, and the bootstraps compared, in a worker thread
(:func:`watch_loop`), then applied on the event loop: parsing a large config took
most of a second, and rendering the two bootstraps 0.6-0.7 s, and decisions waited
for it (Envoy fails a decision open after ``limits.decision_timeout_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sidecar.core.config import Config, ConfigError
from sidecar.core.input_limits import grpc_receive_limit
from sidecar.core.stats import LAYOUT_FIELDS
from sidecar.ops.config_file import MAX_CONFIG_BYTES, load_config
from sidecar.ops.envoy_drift import envoy_drift
from sidecar.ops.log_throttle import UNTHROTTLED
from sidecar.shell.app import App

log = logging.getLogger("tailroute.reload")

Fingerprint = tuple[int, int, str] | None  # (mtime_ns, size, sha256); None = unreadable


def fingerprint(path: Path) -> Fingerprint:
    """Identify the file's current content cheaply enough to do every second."""
    try:
        with path.open("rb") as f:  # what load_config reads of it, at most
            st = os.fstat(f.fileno())
            digest = hashlib.sha256(f.read(MAX_CONFIG_BYTES + 1)).hexdigest()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, digest


# Sections the running process reads only at start: a change is logged, not applied.
# ``limits`` applies at once (each request reads it), but for the gRPC server's receive
# limit, set at start from limits.max_body_bytes and envoy.route_buffer_bytes: a raised
# one is warned about apart (ConfigReloader.apply). Envoy's side of limits (the decision
# timeout) is in the bootstrap, which envoy_drift compares.
_RESTART_ONLY = ("listen", "envoy", "fleet", "workers")  # workers: the supervisor's

# The config compared with, and what Envoy's bootstrap would lose and would keep (envoy_drift).
Drift = tuple[Config, list[str], list[str]]
# The file's fingerprint; its config or why not; its drift from the running config.
Loaded = tuple[Fingerprint, Config | str, Drift | None]


class ConfigReloader:
    """Reloads one config file into one :class:`App`; counts the outcomes."""

    def __init__(self, app: App, path: str | Path,
                 on_reload: Callable[[Config], None] | None = None,
                 loaded_from: Fingerprint = None) -> None:
        """``loaded_from``: the file's fingerprint taken before the running config was
        read from it (None: take it now). Taken later, an edit landing between the read
        and this reloader was taken as the running config's and never applied."""
        self.app = app
        self.path = Path(path)
        self.on_reload = on_reload
        self.counts: Counter[str] = Counter()
        self.last_ok = True
        self.last_error: str | None = None  # why the last attempt was rejected
        # What the running config was loaded from (or older: then one reload too many).
        self._applied = fingerprint(self.path) if loaded_from is None else loaded_from
        self._seen = self._applied

    def counters(self) -> dict[str, int]:
        """``reload:ok``, ``reload:invalid``, ``reload:last_ok`` and ``reload:stats_reset``
        for the metrics collector."""
        return {"reload:ok": self.counts["ok"], "reload:invalid": self.counts["invalid"],
                "reload:last_ok": int(self.last_ok),
                "reload:stats_reset": self.counts["stats_reset"]}

    def view(self, _now: float = 0.0) -> dict[str, object]:
        """The ``config`` section of /state: the file, the attempts and, while the last
        one was rejected, its error (the log line's text: file and field); and how many
        reloads started the statistics afresh (``stats_resets``)."""
        return {"path": str(self.path), "reloads_ok": self.counts["ok"],
                "reloads_invalid": self.counts["invalid"], "last_reload_ok": self.last_ok,
                "last_error": self.last_error, "stats_resets": self.counts["stats_reset"]}

    def _rejected(self, why: str, error: str) -> bool:
        """Log (never throttled: one line per edit or SIGHUP) and count a rejection."""
        log.error("config reload (%s) rejected, keeping the last good config: %s", why, error,
                  extra=UNTHROTTLED)
        return self._reject(error)

    def _reject(self, error: str) -> bool:
        self.counts["invalid"] += 1
        self.last_ok = False
        self.last_error = error
        return False

    def _stats_reset(self, old: Config, new: Config) -> None:
        """Say that the reload started every route's statistics afresh, and why: the
        policy has no evidence until ``min_samples`` come in again."""
        self.counts["stats_reset"] += 1
        fields = [f"stats.{f} {getattr(old.stats, f)} -> {getattr(new.stats, f)}"
                  for f in LAYOUT_FIELDS if getattr(old.stats, f) != getattr(new.stats, f)]
        log.warning("config reload changed %s: every route's statistics start afresh "
                    "(sub-windows of another length cannot be compared); health states "
                    "are kept", ", ".join(fields) or "the statistics' layout",
                    extra=UNTHROTTLED)

    def changed(self) -> bool:
        """Check the file once: True when it changed and has settled since the last check."""
        fp = fingerprint(self.path)
        settled = fp == self._seen
        self._seen = fp
        return fp != self._applied and settled

    def poll(self) -> bool | None:
        """Check the file once; reload if it changed and has settled. None = nothing to do."""
        return self.reload("file changed") if self.changed() else None

    def reload(self, why: str) -> bool:
        """Load the file; apply it if valid, else keep the last good config. Never raises."""
        return self.apply(why, self.load())

    def load(self) -> Loaded:
        """Read and parse the file and compare the bootstraps rendered from it and from
        the running config (no state touched: safe in a worker thread)."""
        fp = fingerprint(self.path)
        try:
            new = load_config(self.path)
        except Exception as exc:  # any problem with the file: a reload never kills the watcher
            # One log line, however many problems the error lists.
            text = (str(exc) if isinstance(exc, ConfigError)
                    else f"{self.path}: {type(exc).__name__}: {exc}")
            return fp, "; ".join(line.strip() for line in text.splitlines() if line.strip()), None
        # Rendering two bootstraps took 0.6-0.7 s with 100 models in hybrid or native
        # mode: on the event loop, the decisions asked meanwhile failed open.
        return fp, new, _drift(self.app.config, new)

    def apply(self, why: str, loaded: Loaded) -> bool:
        """Apply what :meth:`load` found if valid, else keep the last good config."""
        self._applied = self._seen = loaded[0]
        new, drift = loaded[1], loaded[2]
        if isinstance(new, str):
            return self._rejected(why, new)
        old = self.app.config
        if drift is None or drift[0] is not old:  # compared with another config: again
            drift = _drift(old, new)
        _, blocking, advisory = drift
        if blocking:
            return self._rejected(why, (
                f"{self.path}: the Envoy bootstrap rendered from it has other routes or "
                f"header removals ({'; '.join(blocking)}); Envoy routes by the bootstrap it "
                "started with, so re-render it (tailroute envoy-config) and restart Envoy "
                "and tailroute"))
        store = self.app.router.stats
        try:
            self.app.reload(new)
        except Exception as exc:  # a bug in reload must not take down a serving sidecar
            log.exception("config reload (%s) failed to apply, keeping the last good config: "
                          "%r", why, exc)
            return self._reject(f"{self.path}: failed to apply: {exc!r}")
        self.counts["ok"] += 1
        self.last_ok = True
        self.last_error = None
        changed = [s for s in _RESTART_ONLY if getattr(old, s) != getattr(new, s)]
        log.info("config reloaded from %s (%s)", self.path, why)
        if self.app.router.stats is not store:
            self._stats_reset(old, new)
        if changed:
            log.warning("config sections %s changed; they take effect on restart",
                        ", ".join(changed))
        if grpc_receive_limit(new) > grpc_receive_limit(old):
            log.warning("limits.max_body_bytes applies now, but the gRPC server takes messages "
                        "of at most %d bytes until restart (set at start from max_body_bytes "
                        "and envoy.route_buffer_bytes)", grpc_receive_limit(old))
        if advisory:
            log.warning("config reload changed Envoy-side settings (%s); Envoy keeps its "
                        "old ones until its bootstrap is re-rendered (tailroute envoy-config) "
                        "and it restarts", "; ".join(advisory))
        if self.on_reload is not None:
            self.on_reload(new)
        return True


def _drift(old: Config, new: Config) -> Drift:
    try:
        return old, *envoy_drift(old, new)
    except Exception as exc:  # comparing must not be what breaks a reload
        return old, [], [f"not compared ({type(exc).__name__}: {exc})"]


async def watch_loop(reloader: ConfigReloader, stop: asyncio.Event, hup: asyncio.Event,
                     every_s: float = 1.0) -> None:
    """Poll the file every ``every_s`` and reload immediately when ``hup`` is set."""
    while not stop.is_set():
        waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(hup.wait())}
        _, pending = await asyncio.wait(waiters, timeout=every_s,
                                        return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w
        if stop.is_set():
            return
        if hup.is_set():
            hup.clear()
            why = "SIGHUP"
        elif reloader.changed():
            why = "file changed"
        else:
            continue
        # Parsed off the loop (module docstring), applied on it.
        reloader.apply(why, await asyncio.to_thread(reloader.load))
