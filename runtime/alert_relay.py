"""Alert relay: Alertmanager webhooks in, a Feishu/Lark bot message or a plain webhook out.

Alertmanager has no Feishu receiver, and its webhook URLs would otherwise sit in its config
in plain text. So every webhook-type receiver points Alertmanager at this relay
(`http://<relay>/<receiver>`), and the relay, which reads the real destinations from
Secrets through its environment, forwards:

* kind `webhook`: Alertmanager's JSON unchanged, to the receiver's URL;
* kind `feishu`: a text message to a Feishu/Lark custom bot, signed when the bot has a
  signing secret (Feishu's custom-bot signature: base64(HMAC-SHA256(key =
  "<timestamp>\\n<secret>", message = "")), sent with the timestamp).

Routes come from the JSON file named by ALERT_RELAY_ROUTES:
`{"<receiver>": {"kind": "webhook"|"feishu", "url_env": "...", "signing_key_env": "..."}}`.
A destination that fails answers 502, so Alertmanager retries.

Standard library only: it runs from a ConfigMap on a plain Python image.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20
MAX_ALERTS_LISTED = 10
TIMEOUT_SECONDS = 10


def feishu_sign(secret: str, timestamp: int) -> str:
    string_to_sign = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(string_to_sign, b"", hashlib.sha256).digest()).decode()


def feishu_text(payload: dict) -> str:
    """A short text for people: status, count, alert name, severity, then one line per
    alert (its summary, else its labels)."""
    alerts = payload.get("alerts") or []
    common = payload.get("commonLabels") or {}
    status = str(payload.get("status", "firing")).upper()
    name = common.get("alertname") or ", ".join(sorted({a.get("labels", {}).get("alertname", "?") for a in alerts}))
    head = f"[{status}:{len(alerts)}] {name}"
    if common.get("severity"):
        head += f" ({common['severity']})"
    lines = [head]
    for a in alerts[:MAX_ALERTS_LISTED]:
        summary = (a.get("annotations") or {}).get("summary")
        if not summary:
            labels = a.get("labels") or {}
            summary = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
        lines.append(f"- {summary}")
    if len(alerts) > MAX_ALERTS_LISTED:
        lines.append(f"- ... and {len(alerts) - MAX_ALERTS_LISTED} more")
    return "\n".join(lines)


def feishu_message(payload: dict, signing_key: str | None, now: float | None = None) -> dict:
    msg: dict = {"msg_type": "text", "content": {"text": feishu_text(payload)}}
    if signing_key:
        ts = int(now if now is not None else time.time())
        msg["timestamp"] = str(ts)
        msg["sign"] = feishu_sign(signing_key, ts)
    return msg


def load_routes(path: str, env: dict[str, str]) -> dict[str, dict]:
    """Receiver -> {kind, url, signing_key}; a missing variable fails at start, not at 3 am."""
    routes = {}
    for name, spec in json.loads(open(path).read()).items():
        if spec["kind"] not in ("webhook", "feishu"):
            raise ValueError(f"route {name}: kind {spec['kind']!r}; expected webhook or feishu")
        url = env.get(spec["url_env"])
        if not url:
            raise ValueError(f"route {name}: environment variable {spec['url_env']} is empty")
        key_env = spec.get("signing_key_env")
        routes[name] = {"kind": spec["kind"], "url": url.strip(),
                        "signing_key": env.get(key_env, "").strip() if key_env else None}
    return routes


def forward(route: dict, payload: dict) -> int:
    if route["kind"] == "feishu":
        body = feishu_message(payload, route["signing_key"])
    else:
        body = payload
    req = urllib.request.Request(route["url"], data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_SECONDS) as resp:
        status = resp.status
        answer = resp.read(MAX_BODY)
    if route["kind"] == "feishu" and status == 200:
        # Feishu answers 200 with a non-zero `code` when it refuses the message
        # (bad signature, keyword filter, rate limit): that is a failure too.
        try:
            code = json.loads(answer or b"{}").get("code", 0)
        except ValueError:
            code = 0
        if code not in (0, None):
            return 502
    return status


def make_handler(routes: dict[str, dict]):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # one line per request on stderr
            sys.stderr.write("alert-relay: " + (fmt % args) + "\n")

        def _reply(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/healthz":
                self._reply(200, "ok")
            else:
                self._reply(404, "not found")

        def do_POST(self):
            route = routes.get(self.path.strip("/"))
            if route is None:
                self._reply(404, f"no receiver {self.path.strip('/')!r}")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                self._reply(400, "expected an Alertmanager webhook body")
                return
            try:
                payload = json.loads(self.rfile.read(length))
            except ValueError:
                self._reply(400, "body is not JSON")
                return
            try:
                status = forward(route, payload)
            except (urllib.error.URLError, OSError) as exc:
                self._reply(502, f"destination failed: {type(exc).__name__}")
                return
            ok = 200 <= status < 300
            self._reply(200 if ok else 502, "delivered" if ok else f"destination answered {status}")

    return Handler


def main() -> None:
    routes = load_routes(os.environ["ALERT_RELAY_ROUTES"], dict(os.environ))
    host = os.environ.get("ALERT_RELAY_HOST", "0.0.0.0")
    port = int(os.environ.get("ALERT_RELAY_PORT", "8080"))
    server = ThreadingHTTPServer((host, port), make_handler(routes))
    sys.stderr.write(f"alert-relay: {len(routes)} receiver(s) on {host}:{port}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
