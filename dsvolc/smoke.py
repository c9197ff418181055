"""`dsvolc smoke URL_OR_STACK --token T`: check a live OpenAI-compatible endpoint.

Checks, each printed as one PASS/FAIL/SKIP line:

  auth        a request without a token, and one with a wrong token, are refused (401 or 403:
              the edge's JWT check, or vLLM's --api-key)
  completion  one completion with the token: 200, text and a completion token count
  stream      one streamed completion: chunks with text, then `data: [DONE]`
  reasoning   a reasoning model (R1 and its distills) keeps its thinking out of the answer:
              the chat message's `reasoning` is filled and `content` holds no <think> markers
              (the engine runs vLLM's reasoning parser); SKIP for other models
  metrics     the engine's Prometheus endpoint answers with vLLM metrics (only with --metrics)

Exit 0: every check passed (or was skipped); 1: a check failed; 2: bad arguments.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Iterator, Optional

import typer

TOKEN_ENV = "DSVOLC_TOKEN"
THINK_MARKERS = ("<think>", "</think>")
PROMPT = "Say hello."
# Not a JWT and not any key an engine was started with: an endpoint that takes it checks
# only that some token is present.
WRONG_TOKEN = "dsvolc-smoke-wrong-token"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS | FAIL | SKIP
    detail: str

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.detail}"


@dataclass(frozen=True)
class Target:
    url: str  # base URL, no trailing slash
    model: Optional[str]  # None: the first model /v1/models lists
    reasoning: Optional[bool]  # None: inferred from the model's name
    tokenizer: Optional[str] = None  # the model's Hugging Face id, where a stack names the model


class _Http:
    def __init__(self, base: str, token: Optional[str], timeout: float) -> None:
        self.base, self.token, self.timeout = base, token, timeout

    def _request(self, path: str, body: Optional[dict], auth: bool | str) -> urllib.request.Request:
        headers = {"Content-Type": "application/json"}
        token = auth if isinstance(auth, str) else (self.token if auth else None)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        url = path if path.startswith(("http://", "https://")) else self.base + path
        return urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")

    def call(self, path: str, body: Optional[dict] = None, *, auth: bool | str = True) -> tuple[int, str]:
        """(status, body text); status 0 with the reason when no HTTP answer came. ``auth``:
        send the token (True), none (False), or this one (a string)."""
        try:
            with urllib.request.urlopen(self._request(path, body, auth), timeout=self.timeout) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as e:
            return 0, str(getattr(e, "reason", e))

    def stream(self, path: str, body: dict) -> Iterator[str]:
        """The `data:` payloads of a server-sent event stream (HTTPError on a refusal)."""
        with urllib.request.urlopen(self._request(path, body, True), timeout=self.timeout) as r:
            for raw in r:
                line = raw.decode(errors="replace").strip()
                if line.startswith("data:"):
                    yield line[5:].strip()


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _json(text: str) -> Optional[dict]:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def check_auth(http: _Http, model: str) -> Check:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1}
    seen = []
    for what, auth in (("without a token", False), ("with a wrong token", WRONG_TOKEN)):
        status, text = http.call("/v1/completions", body, auth=auth)
        if status == 0:
            return Check("auth", "FAIL", f"no answer: {text}")
        if status not in (401, 403):
            return Check("auth", "FAIL", f"expected 401 or 403 {what}, got {status}: {_short(text)}")
        seen.append(f"{what} ({status})")
    return Check("auth", "PASS", "refused " + " and ".join(seen))


def check_completion(http: _Http, model: str, max_tokens: int) -> Check:
    t0 = time.monotonic()
    status, text = http.call("/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                                                 "temperature": 0})
    took = time.monotonic() - t0
    doc = _json(text)
    if status != 200 or doc is None:
        return Check("completion", "FAIL", f"expected 200 with JSON, got {status}: {_short(text)}")
    choices = doc.get("choices") or [{}]
    tokens = (doc.get("usage") or {}).get("completion_tokens") or 0
    if not isinstance(choices[0].get("text"), str) or tokens < 1:
        return Check("completion", "FAIL", f"no text or no completion tokens in {_short(text)}")
    return Check("completion", "PASS", f"{tokens} tokens in {took:.1f} s")


def check_stream(http: _Http, model: str, max_tokens: int) -> Check:
    chunks, done = 0, False
    try:
        for data in http.stream("/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                                                    "temperature": 0, "stream": True}):
            if data == "[DONE]":
                done = True
                break
            doc = _json(data)
            if doc is None:
                return Check("stream", "FAIL", f"a chunk is not JSON: {_short(data)}")
            if doc.get("error"):
                return Check("stream", "FAIL", f"error in the stream: {_short(data)}")
            if any((c.get("text") or "") for c in doc.get("choices") or []):
                chunks += 1
    except urllib.error.HTTPError as e:
        return Check("stream", "FAIL", f"expected 200, got {e.code}: {_short(e.read().decode(errors='replace'))}")
    except (urllib.error.URLError, OSError) as e:
        return Check("stream", "FAIL", f"stream broke after {chunks} chunks: {getattr(e, 'reason', e)}")
    if not done:
        return Check("stream", "FAIL", f"stream ended after {chunks} chunks without data: [DONE]")
    if chunks == 0:
        return Check("stream", "FAIL", "no chunk carried text before [DONE]")
    return Check("stream", "PASS", f"{chunks} chunks, then [DONE]")


def check_reasoning(http: _Http, model: str, reasoning: bool, max_tokens: int) -> Check:
    if not reasoning:
        return Check("reasoning", "SKIP", f"{model} is not a reasoning model")
    status, text = http.call("/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
        "temperature": 0})
    doc = _json(text)
    if status != 200 or doc is None:
        return Check("reasoning", "FAIL", f"expected 200 with JSON, got {status}: {_short(text)}")
    msg = ((doc.get("choices") or [{}])[0]).get("message") or {}
    # vLLM 0.32 names the field `reasoning`; earlier releases `reasoning_content`
    thinking = msg.get("reasoning") or msg.get("reasoning_content") or ""
    content = msg.get("content") or ""
    leaked = [m for m in THINK_MARKERS if m in content]
    if leaked:
        return Check("reasoning", "FAIL", f"{' and '.join(leaked)} in content: the engine runs without "
                                          f"--reasoning-parser deepseek_r1")
    if not thinking:
        return Check("reasoning", "FAIL", "no reasoning in the message (content: "
                                          f"{_short(content, 80)!r}): the engine runs without a reasoning parser")
    return Check("reasoning", "PASS", f"{len(thinking)} characters of reasoning, {len(content)} of content")


_METRIC = re.compile(r"^vllm:[a-z_]+", re.M)


def check_metrics(http: _Http, url: Optional[str]) -> Check:
    if not url:
        return Check("metrics", "SKIP", "no --metrics URL (the edge does not expose the engine's metrics)")
    status, text = http.call(url, auth=False)
    if status != 200:
        return Check("metrics", "FAIL", f"expected 200 from {url}, got {status or text}")
    names = set(_METRIC.findall(text))
    if not names:
        return Check("metrics", "FAIL", f"{url} answered without vllm: metrics")
    return Check("metrics", "PASS", f"{len(names)} vllm: metric families")


def first_model(http: _Http) -> tuple[Optional[str], str]:
    status, text = http.call("/v1/models")
    doc = _json(text)
    data = (doc or {}).get("data") or []
    if status != 200 or not data:
        return None, f"GET /v1/models: expected 200 with a model, got {status}: {_short(text)}"
    return str(data[0].get("id")), ""


def run_checks(target: Target, token: str, *, metrics_url: Optional[str] = None, timeout: float = 120.0,
               max_tokens: int = 16) -> list[Check]:
    from stacks.plan.build import infer_model_class

    http = _Http(target.url, token, timeout)
    model = target.model
    if model is None:
        model, why = first_model(http)
        if model is None:
            return [Check("models", "FAIL", why)]
    reasoning = target.reasoning if target.reasoning is not None else infer_model_class(model) == "reasoning"
    return [
        check_auth(http, model),
        check_completion(http, model, max_tokens),
        check_stream(http, model, max_tokens),
        check_reasoning(http, model, reasoning, max_tokens),
        check_metrics(http, metrics_url),
    ]


def resolve(url_or_stack: str, model: Optional[str], reasoning: Optional[bool], *,
            url: Optional[str] = None) -> Target:
    """A URL as given; a stack's public endpoint (https://gateway.tls.domain, or ``url`` when
    given), served model name, whether its model reasons (capacity.catalog) and its Hugging
    Face id. ValueError for user mistakes."""
    if url_or_stack.startswith(("http://", "https://")):
        return Target(url_or_stack.rstrip("/"), model, reasoning)
    from capacity.catalog import get_model
    from stacks.loader import SettingsError, load

    try:
        s = load(url_or_stack)
    except SettingsError as exc:
        raise ValueError(str(exc)) from None
    tls = s.gateway.tls
    if url is None and (not s.gateway.edge_enabled or tls is None):
        raise ValueError(f"stack {url_or_stack}: gateway.tls.domain is not set (no public endpoint); "
                         "pass the endpoint's URL instead")
    spec = get_model(s.serving.model)
    return Target(url.rstrip("/") if url else f"https://{tls.domain}",
                  model or s.serving.served_model_name or spec.name,
                  reasoning if reasoning is not None else spec.reasoning_parser is not None, spec.hf_id)


def smoke(
    url_or_stack: str = typer.Argument(..., help="endpoint base URL (http[s]://host[:port]) or a stack name"),
    token: Optional[str] = typer.Option(None, "--token", help=f"API token (JWT) sent as a bearer token; "
                                        f"default ${TOKEN_ENV}"),
    model: Optional[str] = typer.Option(None, "--model", help="model name; default the stack's served model "
                                        "name, or the first one /v1/models lists"),
    reasoning: Optional[bool] = typer.Option(None, "--reasoning/--no-reasoning",
                                             help="expect separated reasoning; default from the model"),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="the engine's Prometheus URL (…/metrics)"),
    timeout: float = typer.Option(120.0, "--timeout", min=1, help="seconds each request may take"),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1, max=4096, help="tokens per generation"),
) -> None:
    """Check a live endpoint: refused without a token and with a wrong one, one completion, one stream to
    [DONE], reasoning separated (reasoning models), metrics reachable (with --metrics).
    Exit 0: all passed; 1: a check failed; 2: bad arguments."""
    token = token or os.environ.get(TOKEN_ENV)
    if not token:
        typer.echo(f"error: --token: expected the API token (or ${TOKEN_ENV}); the auth check needs one to "
                   "compare against", err=True)
        raise typer.Exit(2)
    try:
        target = resolve(url_or_stack, model, reasoning)
    except (ValueError, KeyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    checks = run_checks(target, token, metrics_url=metrics, timeout=timeout, max_tokens=max_tokens)
    for c in checks:
        typer.echo(c.line())
    failed = [c.name for c in checks if c.status == "FAIL"]
    typer.echo(f"{'FAIL' if failed else 'PASS'} {target.url}: "
               + (f"{len(failed)} of {len(checks)} checks failed ({', '.join(failed)})" if failed
                  else f"{sum(c.status == 'PASS' for c in checks)} passed, "
                       f"{sum(c.status == 'SKIP' for c in checks)} skipped"))
    if failed:
        raise typer.Exit(1)
