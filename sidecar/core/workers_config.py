"""The ``workers:`` section: how ``serve --workers N`` tells a hung worker from a busy one.

Pure, like the rest of the config (:mod:`sidecar.core.config_parse`). Only the
supervisor of ``serve --workers N`` reads it (:mod:`sidecar.fleet.liveness`): a
worker beats from its event loop several times a probe period; a probe that
finds no beat since the one before is a miss, and ``probe_misses`` of them in a
row make the worker hung (SIGTERM, SIGKILL after ``kill_grace_s``, restarted
like a worker that died). The section is read when the supervisor starts;
a reload in the workers does not change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sidecar.core.fields import ConfigReader

# A loaded event loop lags (at c = 256 some ext_proc answers passed Envoy's 500 ms
# message timeout, docs/operations.md); a loop that has not run for this long is not
# busy. Below it a worker under load could be killed for being slow.
MIN_HUNG_AFTER_S: Final = 1.0
# How often the supervisor's loop comes round (sidecar.fleet.workers).
MIN_PROBE_INTERVAL_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class WorkersConfig:
    """Liveness of ``serve --workers N``'s workers; ``probe_interval_s`` 0 turns it off."""

    probe_interval_s: float = 1.0
    probe_misses: int = 5  # hung after this many probes in a row found no beat
    kill_grace_s: float = 5.0  # SIGTERM to SIGKILL
    start_timeout_s: float = 60.0  # spawn to the first beat (imports, config, store)

    @property
    def enabled(self) -> bool:
        return self.probe_interval_s > 0

    @property
    def hung_after_s(self) -> float:
        """How long a worker's event loop must not have run before it counts as hung."""
        return self.probe_interval_s * self.probe_misses


def parse_workers(r: ConfigReader) -> WorkersConfig:
    d = WorkersConfig()
    mark = r.mark()
    interval = r.num("probe_interval_s", d.probe_interval_s, lo=0, hi=60)
    misses = r.num("probe_misses", d.probe_misses, lo=2, hi=1000, integer=True)
    probes_ok = r.clean_since(mark)  # else one fell back to its default: no false 2nd error
    cfg = WorkersConfig(
        probe_interval_s=interval, probe_misses=misses,
        kill_grace_s=r.num("kill_grace_s", d.kill_grace_s, lo=0.1, hi=600),
        start_timeout_s=r.num("start_timeout_s", d.start_timeout_s, lo=1, hi=3600),
    )
    r.done()
    if not probes_ok:
        return cfg
    if 0 < cfg.probe_interval_s < MIN_PROBE_INTERVAL_S:
        r.bad(f"must be 0 (off) or >= {MIN_PROBE_INTERVAL_S:g} (the supervisor looks every "
              f"{MIN_PROBE_INTERVAL_S:g} s), got {cfg.probe_interval_s:g}", "probe_interval_s",
              None)
    elif cfg.enabled and cfg.hung_after_s < MIN_HUNG_AFTER_S:
        r.bad(f"probe_interval_s x probe_misses must be >= {MIN_HUNG_AFTER_S:g} s (a loaded "
              f"event loop lags; a worker must not be killed for being busy), got "
              f"{cfg.probe_interval_s:g} x {cfg.probe_misses} = {cfg.hung_after_s:g} s",
              "probe_misses", None)
    return cfg
