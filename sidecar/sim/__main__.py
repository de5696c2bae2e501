"""``python -m sidecar.sim simulate ...`` (same as ``tailroute simulate ...``)."""

from __future__ import annotations

from sidecar.sim.cli import main

raise SystemExit(main())
