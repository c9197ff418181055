"""The shape of the log lines the stack writes, and so what the TLS topics index.

The in-cluster gateway writes its access log as one JSON object per request with exactly
the keys of `ACCESS_LOG_KEYS` (workloads/observability/telemetry.py holds the Envoy command operator of
each key); vLLM, run with `--logging-config.formatter json`, writes the keys of
`SERVING_LOG_KEYS` (vllm/logging_utils/formatter.py JSON_FORMAT in vLLM 0.32:
asctime, levelname, name, processName, process, message). infra/logging.py indexes these
keys in the gateway and serving topics, so that the fields people search (request id,
consumer, model, status, latency) are fields, not substrings.

Values are TLS index value types (`long`, `double`, `text`, `json`: the `value_type` of
volcengine_tls_index key_value, terraform-provider-volcengine v0.0.194
volcengine/tls/index/resource_volcengine_tls_index.go).

May import: nothing of the project.
"""

from __future__ import annotations

ACCESS_LOG_KEYS: dict[str, str] = {
    "start_time": "text",
    "request_id": "text",  # X-Request-ID: the edge's id, preserved by the gateway, vLLM's request id
    "trace_id": "text",  # the W3C trace the request belongs to
    "consumer": "text",  # the verified JWT consumer (the rate-limit key)
    "model": "text",  # the served model name of the route
    "method": "text",
    "path": "text",
    "status": "long",
    "response_flags": "text",
    "duration_ms": "long",  # first request byte to last response byte, at the gateway
    "upstream_ms": "long",  # request sent to vLLM to its last response byte
    "upstream_first_byte_ms": "long",  # request sent to vLLM to its first response byte
    "bytes_received": "long",
    "bytes_sent": "long",
    "route": "text",
    "upstream_host": "text",  # the vLLM pod that served the request
}

# Numbers a query aggregates (p99 latency, error ratio): indexed for SQL analysis too.
ACCESS_LOG_ANALYSED = ("status", "duration_ms", "upstream_ms", "upstream_first_byte_ms", "bytes_sent")

SERVING_LOG_KEYS: dict[str, str] = {
    "asctime": "text",
    "levelname": "text",
    "name": "text",  # the Python logger, e.g. vllm.entrypoints.serve.utils.request_logger
    "processName": "text",
    "process": "long",
    "message": "text",  # "Received request <id>: params: ..." when request logging is on
}

# Characters that split text into search tokens (TLS's default set). '-' is not among them,
# so an id-valued key (request_id, trace_id, a pod name) is one token: `request_id:"<id>"`
# matches it exactly.
TEXT_DELIMITERS = ", '\";=()[]{}?@&<>/:\n\t\r"
# Free text (vLLM's message, the full-text index) also splits on '-': vLLM names a request
# cmpl-<X-Request-Id>-<n> or chatcmpl-<X-Request-Id>, so the caller's id is a run of tokens
# inside a longer word, which the phrase query `message:#"<id>"` finds (TLS docs 6470/1206697).
MESSAGE_DELIMITERS = TEXT_DELIMITERS + "-"
# Keys holding free text rather than a value.
FREE_TEXT_KEYS = ("message",)
