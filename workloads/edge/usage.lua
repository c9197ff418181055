-- Token usage of a response, for the per-consumer token budget (workloads/edge/gateway.py).
--
-- Runs in Envoy's Lua filter (LuaJIT) on the gateway proxies. It reads the response body
-- chunk by chunk as it passes (bodyChunks() neither buffers nor delays a stream), finds the
-- last `"total_tokens": N` of the OpenAI usage object (a non-streamed completion's body, or
-- the usage chunk vLLM sends at the end of a stream with --enable-force-include-usage), and
-- writes N as dynamic metadata. The global rate limit charges it to the consumer when the
-- stream is done (BackendTrafficPolicy cost.response from Metadata).
--
-- ${namespace} and ${key} are filled in by workloads/edge/gateway.py, which names them once
-- for this script and the rate-limit rules that read what it writes.
-- The value is written as a string of digits: it reaches the rate limit through Envoy's
-- %DYNAMIC_METADATA(ns:key)% formatter, whose result must read as an unsigned integer.
-- A response with no usage (an error, a 429) writes "0": nothing is charged.

-- longest text a chunk boundary can cut in two: `"total_tokens": ` and the digits
local CARRY = 64

function envoy_on_response(handle)
  local ns, key = "${namespace}", "${key}"
  local meta = handle:streamInfo():dynamicMetadata()
  local total = "0"
  meta:set(ns, key, total)
  local tail = ""
  for chunk in handle:bodyChunks() do
    local text = tail .. chunk:getBytes(0, chunk:length())
    local last
    for n in string.gmatch(text, '"total_tokens"%s*:%s*(%d+)') do
      last = n
    end
    -- a number at the very end of the text may go on in the next chunk: read it again then
    if last ~= nil and not string.find(text, '"total_tokens"%s*:%s*%d+$') then
      if last ~= total then
        total = last
        meta:set(ns, key, total)
      end
    end
    tail = string.sub(text, -CARRY)
  end
end
