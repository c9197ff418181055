"""Local stand-ins for the APIs the gpu-health controller talks to, for its I/O tests.

* `KubeAPI`: an HTTP server speaking the few Kubernetes API calls the controller makes
  (list nodes by label, get and merge-patch a node, list pods by node, create an Eviction), with
  the API server's behaviour that matters here: bearer-token authentication, RBAC
  authorisation from the rendered ClusterRole/Role (a missing verb is a 403, as the API
  server answers), the merge-patch content type, and resourceVersion compare-and-swap.
* `Prometheus`: the real Prometheus server (Debian `prometheus`, as promtool) scraping a
  local exporter endpoint whose exposition the test sets, so every query the controller
  sends is parsed and evaluated by Prometheus itself.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ports import free_port

TOKEN = "test-token"




def merge_patch(target, patch):
    """RFC 7386 JSON merge patch (what application/merge-patch+json means to the API server)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _allowed(rules: list[dict], verb: str, resource: str) -> bool:
    for r in rules:
        if "" in r.get("apiGroups", []) and resource in r.get("resources", []) and (
                verb in r.get("verbs", []) or "*" in r.get("verbs", [])):
            return True
    return False


class KubeAPI:
    """Nodes and pods in memory; RBAC from the rendered objects of one ServiceAccount."""

    def __init__(self, rbac_objects: list[dict], nodes: list[dict], pods: list[dict]):
        self.cluster_rules = [r for o in rbac_objects if o["kind"] == "ClusterRole" for r in o["rules"]]
        self.ns_rules = {}
        for o in rbac_objects:
            if o["kind"] == "Role":
                self.ns_rules.setdefault(o["metadata"]["namespace"], []).extend(o["rules"])
        self.nodes = {n["metadata"]["name"]: n for n in copy.deepcopy(nodes)}
        self.pods = copy.deepcopy(pods)
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.evicted: list[tuple[str, str]] = []
        self.patches: list[tuple[str, dict]] = []
        api = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                api.requests.append((self.command, self.path, code))
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                                  "message": message, "code": code})

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else None

            def do_GET(self):
                api._handle(self, "GET")

            def do_PATCH(self):
                api._handle(self, "PATCH")

            def do_POST(self):
                api._handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ dispatch

    def _authorised(self, h, verb: str, resource: str, namespace: str | None) -> bool:
        rules = self.cluster_rules + (self.ns_rules.get(namespace, []) if namespace else [])
        if _allowed(rules, verb, resource):
            return True
        where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
        h._status(403, "Forbidden", f'cannot {verb} resource "{resource}"{where}')
        return False

    def _handle(self, h, method: str) -> None:
        if h.headers.get("Authorization") != f"Bearer {TOKEN}":
            return h._status(401, "Unauthorized", "Unauthorized")
        url = urllib.parse.urlsplit(h.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        if parts[:2] != ["api", "v1"]:
            return h._status(404, "NotFound", url.path)
        rest = parts[2:]
        if rest == ["nodes"] and method == "GET":
            if self._authorised(h, "list", "nodes", None):
                h._send(200, {"kind": "NodeList", "items": [n for n in self.nodes.values()
                                                            if _selects(params.get("labelSelector", ""), n)]})
        elif len(rest) == 2 and rest[0] == "nodes" and method == "GET":
            if not self._authorised(h, "get", "nodes", None):
                return
            node = self.nodes.get(rest[1])
            if node is None:
                return h._status(404, "NotFound", f'nodes "{rest[1]}" not found')
            h._send(200, node)
        elif len(rest) == 2 and rest[0] == "nodes" and method == "PATCH":
            if not self._authorised(h, "patch", "nodes", None):
                return
            if h.headers.get("Content-Type") != "application/merge-patch+json":
                return h._status(415, "UnsupportedMediaType", h.headers.get("Content-Type", ""))
            node = self.nodes.get(rest[1])
            if node is None:
                return h._status(404, "NotFound", f'nodes "{rest[1]}" not found')
            patch = h._body()
            rv = patch.get("metadata", {}).get("resourceVersion")
            if rv is not None and rv != node["metadata"]["resourceVersion"]:
                return h._status(409, "Conflict", "the object has been modified")
            new = merge_patch(node, patch)
            new["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
            self.nodes[rest[1]] = new
            self.patches.append((rest[1], patch))
            h._send(200, new)
        elif len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "pods" and method == "GET":
            if self._authorised(h, "list", "pods", rest[1]):
                field = params.get("fieldSelector", "")
                node = field.removeprefix("spec.nodeName=") if field.startswith("spec.nodeName=") else None
                h._send(200, {"kind": "PodList", "items": [
                    p for p in self.pods if p["metadata"]["namespace"] == rest[1]
                    and (node is None or p["spec"]["nodeName"] == node)]})
        elif len(rest) == 5 and rest[0] == "namespaces" and rest[2] == "pods" and rest[4] == "eviction" \
                and method == "POST":
            ns, name = rest[1], rest[3]
            if not self._authorised(h, "create", "pods/eviction", ns):
                return
            body = h._body() or {}
            if (body.get("apiVersion"), body.get("kind"), body.get("metadata", {}).get("name")) != (
                    "policy/v1", "Eviction", name):
                return h._status(400, "BadRequest", f"not an Eviction of {name}: {body}")
            pod = next((p for p in self.pods if p["metadata"]["namespace"] == ns and p["metadata"]["name"] == name),
                       None)
            if pod is None:
                return h._status(404, "NotFound", f'pods "{name}" not found')
            self.pods.remove(pod)
            self.evicted.append((ns, name))
            h._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})
        else:
            h._status(405, "MethodNotAllowed", f"{method} {url.path}")


def _selects(selector: str, obj: dict) -> bool:
    labels = obj["metadata"].get("labels", {})
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if key not in labels or (value and labels[key] != value):
            return False
    return True


def node(name: str, boot: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1", "labels": labels or {}, "annotations": {}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"nodeInfo": {"bootID": boot}}}


def pod(namespace: str, name: str, node_name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node_name}}


# --------------------------------------------------------------------------- Prometheus


class Prometheus:
    """A real Prometheus scraping local exporters whose exposition text `set()` replaces."""

    def __init__(self, tmp: Path, jobs: tuple[str, ...]):
        binary = shutil.which("prometheus")
        assert binary, "prometheus not found: apt-get install -y prometheus (CI's .ci/run does)"
        self.text = {job: "" for job in jobs}
        self.scrapes = {job: 0 for job in jobs}
        prom = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                job = self.path.strip("/")
                data = prom.text.get(job, "").encode()
                prom.scrapes[job] = prom.scrapes.get(job, 0) + 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.exporter = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.exporter.serve_forever, daemon=True).start()
        target = f"127.0.0.1:{self.exporter.server_address[1]}"
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": job, "metrics_path": f"/{job}", "honor_labels": True,
                                      "static_configs": [{"targets": [target]}]} for job in jobs]}
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2)
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise AssertionError("Prometheus never became ready")
                time.sleep(0.2)

    def set(self, job: str, text: str) -> None:
        """New exposition for a job; returns once Prometheus has scraped it twice."""
        self.text[job] = text
        start = self.scrapes[job]
        deadline = time.time() + 30
        while self.scrapes[job] < start + 2:
            assert time.time() < deadline, f"{job} was not scraped"
            time.sleep(0.1)
        time.sleep(0.3)  # the second scrape's samples are appended after the response

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.exporter.shutdown()
        self.exporter.server_close()
