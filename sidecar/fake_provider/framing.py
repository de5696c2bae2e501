"""Other legal SSE framings for the fake provider: line endings and event splits.

The SSE standard lets a server end lines with LF, CRLF or CR, and the network
may cut a stream anywhere. ``--sse-eol`` re-frames every event (the JSON
payloads hold no raw newlines, so only line endings change); ``--sse-split``
regroups the bytes into writes so that chunk boundaries fall inside events
while every event still *completes* at its scheduled time, which keeps the
provider's timing the ground truth:

* ``none`` (default) — one write per scheduled moment, ending where its events end;
* ``mid-line`` — each write also carries the first half of the next event's first
  line, so every chunk boundary is in the middle of a ``data:`` line;
* ``mid-eol`` — with CRLF, each write stops between the CR and the LF of the event's
  final blank line (the event is complete at the CR; the LF opens the next write).
  With LF or CR endings there is no such place and it is the same as ``none``.
"""

from __future__ import annotations

SSE_EOLS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
SSE_SPLITS = ("none", "mid-line", "mid-eol")

Timed = list[tuple[float, bytes]]


def reframe(event: bytes, eol: str) -> bytes:
    """``event`` (built with LF line endings) with the ``eol`` line endings."""
    return event if eol == "lf" else event.replace(b"\n", SSE_EOLS[eol])


def plan_writes(blobs: Timed, split: str) -> Timed:
    """Regroup (due time, bytes) so chunk boundaries fall as ``split`` says (see above)."""
    if split == "none" or len(blobs) < 2:
        return blobs
    if split == "mid-line":
        heads = [0] + [_mid_first_line(b) for _, b in blobs[1:]]
        out = []
        for i, (due, blob) in enumerate(blobs):
            nxt = blobs[i + 1][1][: heads[i + 1]] if i + 1 < len(blobs) else b""
            out.append((due, blob[heads[i]:] + nxt))
        return out
    if split == "mid-eol":
        cuts = [len(b) - 1 if b.endswith(b"\r\n") else len(b) for _, b in blobs]
        out = []
        for i, (due, blob) in enumerate(blobs):
            carry = blobs[i - 1][1][cuts[i - 1]:] if i else b""
            body = blob if i == len(blobs) - 1 else blob[: cuts[i]]
            out.append((due, carry + body))
        return out
    raise ValueError(f"unknown SSE split {split!r} (one of {', '.join(SSE_SPLITS)})")


def _mid_first_line(blob: bytes) -> int:
    end = min((i for i in (blob.find(b"\r"), blob.find(b"\n")) if i >= 0), default=len(blob))
    return max(end // 2, 1)
