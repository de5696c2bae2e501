"""Names shared by the native-mode bootstrap, the weight publisher and the learner.

One slice route per (slice, content-length variant) is rendered; Envoy looks
its cluster weights up under the slice's runtime prefix, and the access log
names the route, which gives the slice back. Keys are built from sanitised
names (runtime keys and route names must not depend on what a model name may
contain), made unique with a short hash when sanitising changed anything.
"""

from __future__ import annotations

import hashlib
import re

from sidecar.core.types import SliceKey

RUNTIME_LAYER = "tailroute_weights"  # the RTDS resource (runtime layer) name
RUNTIME_ROOT = "tailroute.w"
ROUTE_PREFIX = "tailroute/"
METADATA_NS = "tailroute.request"  # json_to_metadata's namespace for model/stream/max_tokens
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _safe(part: str) -> str:
    clean = _UNSAFE.sub("_", part)[:64]
    if clean == part:
        return clean
    return f"{clean}_{hashlib.sha1(part.encode()).hexdigest()[:6]}"


def slice_id(s: SliceKey) -> str:
    """``model.class.profile.stream|unary``, each part sanitised."""
    stream = "stream" if s.streaming else "unary"
    return ".".join((_safe(s.model), _safe(s.klass), s.profile, stream))


def runtime_prefix(s: SliceKey) -> str:
    """The ``weighted_clusters.runtime_key_prefix`` of the slice's routes."""
    return f"{RUNTIME_ROOT}.{slice_id(s)}"


def runtime_key(s: SliceKey, cluster: str) -> str:
    """Where Envoy reads ``cluster``'s weight for slice ``s`` (prefix + "." + cluster name)."""
    return f"{runtime_prefix(s)}.{cluster}"


def route_name(s: SliceKey, variant: str) -> str:
    return f"{ROUTE_PREFIX}{slice_id(s)}/{variant}"
