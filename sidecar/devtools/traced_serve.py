"""``tailroute serve`` under tracemalloc, for memory investigations (a devtool, not for production).

``python -m sidecar.devtools.traced_serve DUMP_PREFIX serve --config ...`` starts
tracemalloc (10 frames) and runs the normal command line; each SIGUSR1 writes a
snapshot to ``DUMP_PREFIX.<n>.snap`` (``tracemalloc.Snapshot.load`` reads it back).
``tailroute bench soak --tracemalloc`` uses it to print what grew after warm-up.
"""

from __future__ import annotations

import gc
import signal
import sys
import tracemalloc
from types import FrameType


def main(argv: list[str]) -> int:
    prefix, rest = argv[0], argv[1:]
    # Import first, trace after: module import costs are not what an investigation is after
    # and tracing them makes start-up slow.
    import sidecar.serve  # noqa: F401
    from sidecar.cli import main as cli_main

    tracemalloc.start(10)
    dumps = [0]

    def dump(signum: int, frame: FrameType | None) -> None:
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        snap.dump(f"{prefix}.{dumps[0]}.snap")
        dumps[0] += 1

    signal.signal(signal.SIGUSR1, dump)
    return cli_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
