"""Multi-node groups that start and recover: the rendered objects, and the commands they
run executed for real.

* start: a worker's init container waits, bounded, until its leader's engine listens
  (vLLM's headless worker otherwise exits 5 minutes into a leader's weights sync); groups
  prefer nodes the pre-warm labelled with the weights revision it verified; the label goes
  when the revision changes (runtime/weights.py against a local Kubernetes API with the
  rendered RBAC);
* stop: a worker's preStop waits only while its leader has requests in flight that make
  progress (runtime/health.py `drain` against a local /metrics);
* NCCL: RDMA pools force the IB transport (NCCL_NET=IB) and the start-up probes require
  NCCL's log to show it, parsed from lines in NCCL's own format.
"""

from __future__ import annotations

import copy
import hashlib
import fnmatch
import socket
import subprocess
import sys
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import local_apis
from ports import free_port
from runtime import gpu_health, health, weights
from stacks import read_raw
from stacks.constants import WEIGHTS_LABEL
from test_manifests import ctx_for, objects, workload
from workloads.edge import network_policy
from workloads.engine import engine_args, groups, manifests, rdma, resilience

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"


def group(stack: str = "prod", raw: dict | None = None) -> dict:
    return workload(objects(stack, raw))["spec"]["leaderWorkerTemplate"]


def run(cmd: list[str], env: dict | None = None, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """A rendered `python3 -m runtime...` command, run here (python3 -> this interpreter)."""
    assert cmd[:2] == ["python3", "-m"], cmd
    start = time.monotonic()
    out = subprocess.run([sys.executable, *cmd[1:]], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={"PATH": "/usr/bin:/bin", **(env or {})})
    return out, time.monotonic() - start


def with_flag(cmd: list[str], flag: str, value: str) -> list[str]:
    out = list(cmd)
    out[out.index(flag) + 1] = value
    return out


# --------------------------------------------------------------------------- start: wait for the leader


def test_workers_wait_for_the_leader_bounded_by_its_sync():
    ctx = ctx_for("prod")
    g = group()
    leader_init = [c["name"] for c in g["leaderTemplate"]["spec"]["initContainers"]]
    worker_init = g["workerTemplate"]["spec"]["initContainers"]
    assert leader_init == ["weights-sync"]
    # after the worker's own sync, before its engine
    assert [c["name"] for c in worker_init] == ["weights-sync", "wait-for-leader"]
    cmd = worker_init[-1]["command"]
    assert cmd[:4] == ["python3", "-m", "runtime.health", "wait-leader"]
    # DP16 over two nodes: the workers' engines handshake on the leader's DP RPC port
    assert ctx.engine.data_parallel_size > 1 and int(cmd[cmd.index("--port") + 1]) == engine_args.DP_RPC_PORT
    assert int(cmd[cmd.index("--timeout") + 1]) == manifests.sync_seconds(ctx) + groups.LEADER_START_MARGIN_SECONDS
    assert manifests.sync_seconds(ctx) > 5 * 60  # longer than vLLM's handshake timeout: why the wait exists
    assert worker_init[-1]["securityContext"] == manifests.container_security()


def test_a_tp_pp_group_waits_on_the_master_port():
    raw = copy.deepcopy(read_raw("prod"))
    raw["serving"]["engine"].update(parallelism="tp_pp", tensor_parallel_size=8, pipeline_parallel_size=2)
    raw["serving"]["engine"].pop("speculative_tokens", None)
    cmd = group("prod", raw)["workerTemplate"]["spec"]["initContainers"][-1]["command"]
    assert int(cmd[cmd.index("--port") + 1]) == groups.VLLM_MASTER_PORT == 29501


def test_the_wait_returns_when_the_leader_listens_and_fails_past_its_bound():
    cmd = group()["workerTemplate"]["spec"]["initContainers"][-1]["command"]
    port = free_port()
    cmd = with_flag(with_flag(cmd, "--port", str(port)), "--timeout", "3") + ["--interval", "0.2"]
    env = {"LWS_LEADER_ADDRESS": "127.0.0.1"}

    # nobody listens: exit 1 once the bound has passed, saying why
    out, took = run(cmd, env)
    assert out.returncode == 1 and 3 <= took < 15
    assert "did not listen within 3 s" in out.stderr

    # the leader starts listening after a second: the wait ends then, well inside the bound
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def start_later():
        time.sleep(1)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    t = threading.Thread(target=start_later)
    t.start()
    try:
        out, took = run(with_flag(cmd, "--timeout", "30"), env)
    finally:
        t.join()
        listener.close()
    assert out.returncode == 0 and took < 10, out.stderr
    assert "is listening" in out.stdout

    # a leader whose name does not resolve yet (no IP) is waited for too
    out, _ = run(cmd, {"LWS_LEADER_ADDRESS": "leader-0.nowhere.invalid"})
    assert out.returncode == 1 and "not listening yet" in out.stdout


# --------------------------------------------------------------------------- start: the node label


def test_groups_prefer_nodes_marked_with_their_revision():
    ctx = ctx_for("prod")
    rev = groups.weights_revision(ctx)
    for t in (group()["leaderTemplate"], group()["workerTemplate"]):
        aff = t["spec"]["affinity"]["nodeAffinity"]
        (pref,) = aff["preferredDuringSchedulingIgnoredDuringExecution"]
        assert pref["preference"]["matchExpressions"] == [{"key": WEIGHTS_LABEL, "operator": "In", "values": [rev]}]
        # preferred, never required: the autoscaler's template node has no such label
        required = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert all(e["key"] != WEIGHTS_LABEL for term in required for e in term["matchExpressions"])
    assert hashlib.sha256(manifests.weights_uri(ctx).encode()).hexdigest()[:16] == rev  # what the pods sync
    # another prefix is another revision
    raw = copy.deepcopy(read_raw("prod"))
    raw["weights"]["prefix"] = "models-v2"
    assert groups.weights_revision(ctx_for("prod", raw)) != rev
    # single-node stacks neither mark nor prefer
    for stack in ("dev", "staging"):
        t = workload(objects(stack))["spec"]["template"]
        assert "preferredDuringSchedulingIgnoredDuringExecution" not in t["spec"]["affinity"]["nodeAffinity"]


def prewarm_objects(ctx) -> dict:
    return {(o["kind"], o["metadata"]["name"]): o for o in resilience.render(ctx)}


def test_the_prewarm_marks_its_node_with_least_privilege():
    ctx = ctx_for("prod")
    objs = prewarm_objects(ctx)
    name = f"{ctx.release}-prewarm"
    ds = objs[("DaemonSet", name)]["spec"]["template"]["spec"]
    assert ds["serviceAccountName"] == name and ds["automountServiceAccountToken"] is False
    assert objs[("ServiceAccount", name)]["automountServiceAccountToken"] is False
    (rule,) = objs[("ClusterRole", name)]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    binding = objs[("ClusterRoleBinding", name)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}]
    init = {c["name"]: c for c in ds["initContainers"]}
    sync = init["weights-sync"]["command"]
    assert sync[sync.index("--mark-node") + 1] == f"{WEIGHTS_LABEL}={groups.weights_revision(ctx)}"
    env = {e["name"]: e for e in init["weights-sync"]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the API token reaches the sync container alone
    holders = [c["name"] for c in ds["initContainers"] + ds["containers"]
               if any(m["name"] == "kube-api-token" for m in c.get("volumeMounts", []))]
    assert holders == ["weights-sync"]
    # and its NetworkPolicy lets the pre-warm pods, only them, reach the API server
    pol = next(p for p in network_policy.render(ctx) if p["metadata"]["name"].endswith("prewarm-kube-api"))
    assert pol["spec"]["podSelector"]["matchLabels"] == ctx.selector("prewarm")
    # single-node stacks keep the pre-warm without any node permission
    dev = prewarm_objects(ctx_for("dev"))
    assert not any(k == "ClusterRole" and n.endswith("-prewarm") for k, n in dev)
    assert not any(p["metadata"]["name"].endswith("prewarm-kube-api") for p in network_policy.render(ctx_for("dev")))


@pytest.fixture()
def checkpoint(tmp_path) -> Path:
    """A small checkpoint whose tokenizer agrees with its config (the sync verifies it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    import json

    src = tmp_path / "src"
    src.mkdir()
    vocab = {"<s>": 0, "</s>": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<s>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}))
    (src / "config.json").write_text(json.dumps({"vocab_size": 8, "bos_token_id": 0, "eos_token_id": 1}))
    (src / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 4096)
    (tmp_path / "cache").mkdir()
    return src


def marking(ctx, rbac_rules: list[dict] | None = None, labels: dict | None = None):
    name = f"{ctx.release}-prewarm"
    objs = prewarm_objects(ctx)
    rbac = [objs[("ClusterRole", name)]]
    if rbac_rules is not None:
        rbac = [{**rbac[0], "rules": rbac_rules}]
    return local_apis.KubeAPI(rbac, [local_apis.node("gpu-a", "boot-1", labels)], [])


def rendered_sync(ctx, checkpoint: Path, cache: Path) -> list[str]:
    """The pre-warm's sync arguments with the bucket replaced by a local directory."""
    ds = prewarm_objects(ctx)[("DaemonSet", f"{ctx.release}-prewarm")]["spec"]["template"]["spec"]
    cmd = next(c for c in ds["initContainers"] if c["name"] == "weights-sync")["command"]
    args = cmd[cmd.index("sync"):]
    i = args.index("--bucket")
    del args[i:i + 2 * 5]  # --bucket --prefix --endpoint --region --connections and their values
    assert args[1:3] == ["--dest", f"{manifests.MODEL_CACHE_DIR}/{ctx.model.name}"]
    return [args[0], "--source-dir", str(checkpoint), "--dest", str(cache / ctx.model.name), *args[3:],
            "--node", "gpu-a"]


def run_sync(monkeypatch, api, argv) -> int:
    monkeypatch.setattr(gpu_health.Cluster, "in_cluster",
                        classmethod(lambda cls: cls(api.url, local_apis.TOKEN, None)))
    return weights.main(argv)


@pytest.mark.engine  # the checkpoint's tokenizer is written with tokenizers
def test_a_verified_sync_labels_the_node_with_its_revision(monkeypatch, checkpoint, capsys):
    ctx = ctx_for("prod")
    rev = groups.weights_revision(ctx)
    api = marking(ctx)
    try:
        assert run_sync(monkeypatch, api, rendered_sync(ctx, checkpoint, checkpoint.parent / "cache")) == 0
        assert api.nodes["gpu-a"]["metadata"]["labels"][WEIGHTS_LABEL] == rev
        assert [p for _, p in api.patches] == [{"metadata": {"labels": {WEIGHTS_LABEL: rev}}}]
        # once there, a restarted pre-warm patches nothing
        assert run_sync(monkeypatch, api, rendered_sync(ctx, checkpoint, checkpoint.parent / "cache")) == 0
        assert len(api.patches) == 1
    finally:
        api.close()


@pytest.mark.engine  # the checkpoint's tokenizer is written with tokenizers
def test_a_new_revision_removes_the_old_label_before_its_sync(monkeypatch, checkpoint, capsys):
    ctx = ctx_for("prod")
    api = marking(ctx, labels={WEIGHTS_LABEL: "0123456789abcdef", "other": "kept"})
    cache = checkpoint.parent / "cache"
    try:
        # the new revision's files are not in the bucket yet: the sync fails, and the node
        # no longer claims the old revision, whose files the sync was about to replace
        empty = checkpoint.parent / "empty"
        empty.mkdir()
        argv = rendered_sync(ctx, checkpoint, cache)
        argv[argv.index("--source-dir") + 1] = str(empty)
        assert run_sync(monkeypatch, api, argv) == 1
        labels = api.nodes["gpu-a"]["metadata"]["labels"]
        assert WEIGHTS_LABEL not in labels and labels["other"] == "kept"
        # then a complete sync labels it with the new revision
        assert run_sync(monkeypatch, api, rendered_sync(ctx, checkpoint, cache)) == 0
        assert api.nodes["gpu-a"]["metadata"]["labels"][WEIGHTS_LABEL] == groups.weights_revision(ctx)
        assert [p["metadata"]["labels"][WEIGHTS_LABEL] for _, p in api.patches] == [
            None, groups.weights_revision(ctx)]
    finally:
        api.close()


@pytest.mark.engine  # the checkpoint's tokenizer is written with tokenizers
def test_without_patch_rights_the_prewarm_says_so(monkeypatch, checkpoint, capsys):
    ctx = ctx_for("prod")
    api = marking(ctx, rbac_rules=[{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}])
    try:
        assert run_sync(monkeypatch, api, rendered_sync(ctx, checkpoint, checkpoint.parent / "cache")) == 1
    finally:
        api.close()
    err = capsys.readouterr().err
    assert "HTTP 403: the pre-warm's ServiceAccount may not patch nodes" in err


def test_a_malformed_mark_is_refused_by_name():
    with pytest.raises(weights.WeightsError, match=r"--mark-node: expected KEY=VALUE, got 'nolabel'"):
        weights.node_mark("nolabel", "n", cluster=object())
    with pytest.raises(weights.WeightsError, match=r"--node or \$NODE_NAME"):
        weights.node_mark("k=v", None, cluster=object())


# --------------------------------------------------------------------------- stop: the worker's preStop

METRICS = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
           "generated": "vllm:generation_tokens_total", "prompt": "vllm:prompt_tokens_total"}


def test_the_drain_reads_metrics_vllm_serves():
    ref = {line.split()[0] for line in (DATA / "vllm-0.32-metrics.txt").read_text().splitlines() if line.strip()}
    assert {health.RUNNING, health.WAITING, *health.PROGRESS} <= ref


class Leader:
    """A leader's /metrics: per-engine series as vLLM labels them (model_name, engine)."""

    def __init__(self):
        self.running = {0: 0, 1: 0}
        self.tokens = 0
        self.progressing = False
        leader = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if leader.progressing:
                    leader.tokens += 7
                lines = []
                for engine, n in leader.running.items():
                    lab = f'{{engine="{engine}",model_name="deepseek-r1"}}'
                    lines += [f"vllm:num_requests_running{lab} {n:.1f}", f"vllm:num_requests_waiting{lab} 0.0",
                              f"vllm:generation_tokens_total{lab} {leader.tokens:.1f}",
                              f"vllm:prompt_tokens_total{lab} 100.0"]
                data = ("# TYPE vllm:num_requests_running gauge\n" + "\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def pre_stop(min_s="1", max_s="8", stall="2") -> list[str]:
    """The worker's rendered preStop, with its times scaled down for the test."""
    cmd = group()["workerTemplate"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    cmd = with_flag(with_flag(with_flag(cmd, "--min-seconds", min_s), "--max-seconds", max_s),
                    "--stall-seconds", stall)
    return cmd + ["--interval", "0.2"]


@pytest.fixture()
def leader():
    srv = Leader()
    yield srv
    srv.close()


def drain(port: int, **kw) -> tuple[str, float]:
    cmd = with_flag(pre_stop(**kw), "--port", str(port))
    out, took = run(cmd, {"LWS_LEADER_ADDRESS": "127.0.0.1"})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), took


def test_a_torn_down_group_does_not_wait():
    # the leader is gone (its engine died with the group): nothing to drain, no 620 s
    why, took = drain(free_port())
    assert "leader unreachable" in why and took < 3


def test_an_idle_leader_is_given_its_own_prestop_then_released(leader):
    why, took = drain(leader.port, min_s="1.5")
    # released by its own clock at the minimum (1.5 s, polled every 0.2 s), not held to the 8 s
    # bound; the wall time adds the interpreter's start, seconds on a loaded 2-core machine
    waited = re.search(r"no request in flight after (\d+) s", why)
    assert waited and int(waited.group(1)) <= 2 and 1.5 <= took < 8, (why, took)


def test_requests_in_flight_are_drained_to_the_end(leader):
    leader.running = {0: 3, 1: 1}  # rank imbalance: the sum over engines counts
    leader.progressing = True
    threading.Timer(3.0, lambda: leader.running.update({0: 0, 1: 0})).start()
    why, took = drain(leader.port)
    assert "no request in flight" in why and 3 <= took < 6


def test_a_stuck_leader_is_not_waited_for(leader):
    leader.running = {0: 2, 1: 0}
    leader.progressing = False  # requests "running", no token: a collective with a dead peer
    why, took = drain(leader.port, stall="2")
    assert "no token for 2 s" in why and 2 <= took < 5


def test_the_wait_is_bounded(leader):
    leader.running = {0: 1, 1: 1}
    leader.progressing = True
    why, took = drain(leader.port, max_s="3")
    assert "after 3 s (the bound)" in why and 3 <= took < 6


def test_the_bound_is_the_old_drain_budget_and_fits_the_grace():
    ctx = ctx_for("prod")
    spec = group()["workerTemplate"]["spec"]
    cmd = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    sv = ctx.settings.serving
    assert int(cmd[cmd.index("--min-seconds") + 1]) == sv.drain_seconds
    assert int(cmd[cmd.index("--max-seconds") + 1]) == sv.drain_seconds + sv.inflight_drain_seconds
    assert spec["terminationGracePeriodSeconds"] > sv.drain_seconds + sv.inflight_drain_seconds
    # the leader keeps its plain sleep: it is the one the gateway stops sending to
    assert group()["leaderTemplate"]["spec"]["containers"][0]["lifecycle"]["preStop"] == {
        "sleep": {"seconds": sv.drain_seconds}}


# --------------------------------------------------------------------------- NCCL on IB

# Log lines in NCCL's format: the prefix `<host>:<pid>:<tid> [<dev>] NCCL INFO ` and WARN
# lines as NVIDIA/nccl src/debug.cc writes them; the messages as
# src/transport/net_ib/init.cc ("NET/IB : Using%s %s; OOB %s:%s", each device
# " [%d]%s:%d/%s" with the link layer), src/init.cc ("Using network %s") and
# src/transport/net_socket.cc ("NET/Socket : Using%s", " [%d]%s:%s") print them, at commit
# 5067397c; "Initialized NET plugin IB", "Using network IB" and the WARN line are verbatim
# from NCCL's docs/userguide/source/troubleshooting/logging.rst.
IB_LOG = """\
h20-0:3873285:3873285 [0] NCCL INFO Bootstrap: Using eth0:10.30.1.5<0>
h20-0:3873285:3873285 [0] NCCL INFO NET/IB : Using [0]mlx5_1:1/RoCE [1]mlx5_2:1/RoCE [2]mlx5_3:1/RoCE [3]mlx5_4:1/RoCE [RO]; OOB eth0:10.30.1.5<0>
h20-0:3873285:3873285 [0] NCCL INFO Initialized NET plugin IB
h20-0:3873285:3873285 [0] NCCL INFO Assigned NET plugin IB to comm
h20-0:3873285:3873285 [0] NCCL INFO Using network IB
"""
IB_LOG_NO_RO = ("h20-1:17:17 [3] NCCL INFO NET/IB : Using [0]mlx5_1:1/RoCE [1]mlx5_2:1/RoCE ; OOB eth0:10.30.1.6<0>\n"
                "h20-1:17:17 [3] NCCL INFO Using network IB\n")
SOCKET_LOG = """\
h20-1:1895902:1895913 [0] NCCL INFO NET/IB : No device found.
h20-1:1895902:1895913 [0] NCCL INFO NET/Socket : Using [0]eth0:10.30.1.6<0>
h20-1:1895902:1895913 [0] NCCL INFO Using network Socket
"""
FAILED_LOG = ("[2026-05-05 06:16:47] h20-1:189884:189884 [3] plugin/net.cc:334 NCCL WARN Failed to initialize "
              "any NET plugin\n")


def test_nccl_lines_parse():
    log = health.parse_nccl_log(IB_LOG)
    assert log.ib_devices == ["mlx5_1:1/RoCE", "mlx5_2:1/RoCE", "mlx5_3:1/RoCE", "mlx5_4:1/RoCE"]
    assert log.networks == ["IB"] and not log.socket_transport
    assert health.parse_nccl_log(IB_LOG_NO_RO).ib_devices == ["mlx5_1:1/RoCE", "mlx5_2:1/RoCE"]
    sock = health.parse_nccl_log(SOCKET_LOG)
    assert sock.ib_devices == [] and sock.networks == ["Socket"] and sock.socket_transport
    assert health.parse_nccl_log(FAILED_LOG).warnings == ["Failed to initialize any NET plugin"]


def test_rdma_engines_force_ib_and_log_where_the_check_reads():
    g = group()
    for t in (g["leaderTemplate"], g["workerTemplate"]):
        env = {e["name"]: e.get("value") for e in t["spec"]["containers"][0]["env"]}
        assert env["NCCL_NET"] == "IB"  # fail rather than fall back to sockets
        assert env["NCCL_DEBUG"] == "INFO" and set(env["NCCL_DEBUG_SUBSYS"].split(",")) >= {"INIT", "NET"}
        # NCCL expands %h and %p: every process's file matches the probe's glob, in the tmp emptyDir
        written = env["NCCL_DEBUG_FILE"].replace("%h", "h20-0").replace("%p", "4242")
        cmd = t["spec"]["containers"][0]["startupProbe"]["exec"]["command"]
        assert fnmatch.fnmatch(written, cmd[cmd.index("--nccl-logs") + 1])
        assert Path(written).parent == Path(manifests.TMP_DIR)
    # single-node and non-RDMA engines are untouched
    dev = workload(objects("dev"))["spec"]["template"]["spec"]["containers"][0]
    assert not any(e["name"].startswith("NCCL_") for e in dev["env"]) and "httpGet" in dev["startupProbe"]


class Health:
    def __init__(self, code: int):
        self.code = code
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self.send_response(outer.code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("logs, ok, says", [
    ({"a": IB_LOG, "b": IB_LOG_NO_RO}, True, ""),
    ({"a": IB_LOG, "b": SOCKET_LOG}, False, "use network Socket, not IB"),
    ({"a": FAILED_LOG}, False, "NCCL warned: Failed to initialize any NET plugin"),
    ({}, False, "no NCCL log matches"),
    ({"a": "h:1:1 [0] NCCL INFO Bootstrap: Using eth0:10.30.1.5<0>\n"}, False, "shows the IB transport"),
])
def test_the_leaders_startup_probe_requires_ib(tmp_path, logs, ok, says):
    for name, text in logs.items():
        (tmp_path / f"nccl.h20-0.{name}.log").write_text(text)
    cmd = group()["leaderTemplate"]["spec"]["containers"][0]["startupProbe"]["exec"]["command"]
    cmd = with_flag(cmd, "--nccl-logs", str(tmp_path / Path(rdma.NCCL_LOG_GLOB).name))
    up = Health(200)
    try:
        out, _ = run(with_flag(cmd, "--url", up.url))
    finally:
        up.close()
    assert (out.returncode == 0) == ok, out.stderr
    assert says in out.stderr
    # an engine not up yet fails it whatever NCCL says
    down = Health(503)
    try:
        out, _ = run(with_flag(cmd, "--url", down.url))
    finally:
        down.close()
    assert out.returncode == 1 and "does not answer 200" in out.stderr


def test_the_workers_startup_probe_requires_ib(tmp_path):
    cmd = group()["workerTemplate"]["spec"]["containers"][0]["startupProbe"]["exec"]["command"]
    cmd = with_flag(with_flag(cmd, "--expect", "0"), "--nccl-logs", str(tmp_path / "nccl.*.log"))
    (tmp_path / "nccl.h20-1.7.log").write_text(SOCKET_LOG)
    out, _ = run(cmd)
    assert out.returncode == 1 and "not IB" in out.stderr
    (tmp_path / "nccl.h20-1.7.log").write_text(IB_LOG)
    out, _ = run(cmd)
    assert out.returncode == 0, out.stderr


# --------------------------------------------------------------------------- the program


@pytest.fixture(scope="module")
def prod_program():
    from dsvolc import engine

    return engine.run("prod", read_raw("prod"), mode="existing")


def test_the_program_deploys_the_group_pieces(prod_program):
    """The same pieces in what the Pulumi program registers (its mock engine), not only in
    the renderer's output."""
    by = {}
    for r in prod_program.resources:
        by.setdefault(r.type.rsplit(":", 1)[-1], []).append(r.inputs)
    (lws,) = by["LeaderWorkerSet"]
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert [c["name"] for c in worker["initContainers"]] == ["weights-sync", "wait-for-leader"]
    assert worker["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][3] == "drain"
    env = {e["name"]: e.get("value") for e in worker["containers"][0]["env"]}
    assert env["NCCL_NET"] == "IB"
    role = next(r for r in by["ClusterRole"] if r["metadata"]["name"].endswith("-prewarm"))
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert any(p["metadata"]["name"].endswith("prewarm-kube-api") for p in by["NetworkPolicy"])
    ds = next(d for d in by["DaemonSet"] if d["metadata"]["name"].endswith("-prewarm"))
    assert ds["spec"]["template"]["spec"]["serviceAccountName"].endswith("-prewarm")
