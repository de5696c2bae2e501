"""The rendered Envoy's ``[DONE]`` mark: a stream that passed its last event.

A client that never asks for usage (the OpenAI SDKs' default) and closes the
connection at ``data: [DONE]`` (the OpenAI Python SDK's synchronous stream does)
leaves before Envoy sees the upstream's end of the body whenever the provider writes
that end a little later: the access-log entry of a complete answer then has neither
usage nor an end time, and would read as a user pressing stop. Envoy's own
``sse_to_metadata`` filter cannot tell: ``[DONE]`` is not JSON, and its ``on_error``
is written only at the end of the body, which such a stream never reaches.

So a Lua filter watches the response body as it streams by (``bodyChunks``: each
chunk passes on at once, nothing is buffered) and, at the first SSE line whose whole
data value is ``[DONE]``, writes the time into dynamic metadata
(``envoy_contract.USAGE_NS`` / ``DONE_KEY``: microseconds since the epoch, Envoy's
clock), which the gRPC access log carries with the entry. The sidecar then reads a
client that left after that mark as a complete answer
(:mod:`sidecar.core.envoy_log`).

What it matches, as an SSE reader dispatches it: a line ``data:[DONE]`` or
``data: [DONE]`` (one optional space, as SSE strips one), between line ends of any
kind (CR, LF, CRLF) -- so a ``[DONE]`` inside a JSON string of a data line (a model
that writes the text) never matches: JSON has no raw line break within a string.
The sentinel may be split across body chunks, so the last 13 bytes of the previous
chunk (a line end and ``data: [DONE]``) are searched with the next one. Per chunk
the work is one plain ``string.find`` for ``[DONE]`` (a copy of the chunk into Lua
and of the short tail); the line around a hit is checked only then. After the mark,
the script ends and the rest of the body passes without Lua. A response that is not
``text/event-stream`` returns at once.
"""

from __future__ import annotations

from typing import Any

from sidecar.shell import envoy_contract as ec

DONE_FILTER = "tailroute.done"
_LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"

# Bytes of the previous chunk kept for the next search: "\ndata: [DONE]" is 13, so a
# match whose last byte (its line end) is in the next chunk has all the rest here.
_TAIL = 13

LUA_SOURCE = f"""\
local function marks(s, i)
  -- s:sub(i, i + 5) is "[DONE]": the whole value of a data line?
  local after = s:byte(i + 6)
  if after ~= 10 and after ~= 13 then return false end
  local p = i - 1
  if s:byte(p) == 32 then p = p - 1 end
  if s:sub(p - 4, p) ~= "data:" then return false end
  local before = s:byte(p - 5)
  return before == 10 or before == 13
end

function envoy_on_response(handle)
  local ct = handle:headers():get("content-type")
  if ct == nil or not ct:lower():find("text/event-stream", 1, true) then return end
  local tail = "\\n"
  for chunk in handle:bodyChunks() do
    local s = tail .. chunk:getBytes(0, chunk:length())
    local i = s:find("[DONE]", 1, true)
    while i do
      if marks(s, i) then
        handle:streamInfo():dynamicMetadata():set("{ec.USAGE_NS}", "{ec.DONE_KEY}",
          handle:timestampString(EnvoyTimestampResolution.MICROSECOND))
        return
      end
      i = s:find("[DONE]", i + 1, true)
    end
    tail = s:sub(-{_TAIL})
  end
end
"""


def done_filter() -> dict[str, Any]:
    """The Lua filter that marks a stream at its ``[DONE]`` line (module docstring)."""
    return {
        "name": DONE_FILTER,
        "typed_config": {"@type": _LUA, "default_source_code": {"inline_string": LUA_SOURCE}},
    }
