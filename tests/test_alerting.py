"""Alert delivery, through the real Alertmanager tooling (Debian `prometheus-alertmanager`:
amtool and the server; CI's .ci/run installs it).

* the rendered configuration passes `amtool check-config`;
* `amtool config routes test`: a critical reaches the pager, a warning does not;
* a real Alertmanager with the rendered routes and inhibitions, posting to the real relay
  (runtime/alert_relay.py), delivers a critical to the webhook receiver and a signed
  message to a Feishu bot endpoint (both local test servers), and inhibits the alerts a
  cause makes redundant.

Only the destinations (loopback servers instead of Secrets' URLs) and the grouping waits
(1 s instead of 30 s) differ from what ships.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

import stacks
from runtime import alert_relay
from stacks import SettingsError, parse, parse_plan
from tests.k8s_schema import validate_all
from tests.stack_fixtures import filled_raw
from workloads.observability import alerting
from workloads.observability import monitoring
from workloads.platform import controllers as platform
from stacks.plan import build_plan
from workloads.engine.context import build_context
from ports import free_port as _free_port

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: apt-get install -y prometheus-alertmanager (CI's .ci/run does)"
    return path


def _write_config(cfg: dict, tmp_path: Path) -> Path:
    p = tmp_path / "alertmanager.yml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return p


def _routes(config_file: Path, *labels: str) -> list[str]:
    res = subprocess.run([_tool("amtool"), "config", "routes", "test", f"--config.file={config_file}", *labels],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(",")


# --------------------------------------------------------------------------- rendering


def test_receivers_and_routes_follow_the_settings():
    cfg = alerting.config(stacks.load("prod"))
    names = [r["name"] for r in cfg["receivers"]]
    assert names == ["null", "oncall", "deadman", "ops-feishu"]
    crit = [r["receiver"] for r in cfg["route"]["routes"] if r["matchers"] == ['severity="critical"']]
    warn = [r["receiver"] for r in cfg["route"]["routes"] if r["matchers"] == ['severity="warning"']]
    assert crit == ["oncall", "ops-feishu"] and warn == ["ops-feishu"]
    # no URL or key of a Secret is in the configuration: webhooks go to the relay
    for r in cfg["receivers"][1:]:
        (hook,) = r["webhook_configs"]
        assert hook["url"] == f"http://alert-relay:8080/{r['name']}"


def test_the_chart_gets_the_configuration_and_the_relay_its_secrets():
    s = stacks.load("prod")
    (kps,) = [r for r in platform.releases(build_plan(s)) if r["name"] == "kube-prometheus-stack"]
    assert kps["values"]["alertmanager"]["config"] == alerting.config(s)
    objs = alerting.relay(s)
    validate_all(objs, s.cluster.kubernetes_version)
    dep = next(o for o in objs if o["kind"] == "Deployment")
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RELAY_ONCALL_URL"] == {"name": "alerting-oncall", "key": "url"}
    assert env["RELAY_OPS_FEISHU_URL"] == {"name": "alerting-feishu", "key": "url"}
    assert env["RELAY_OPS_FEISHU_SIGNING_KEY"] == {"name": "alerting-feishu", "key": "signing-key"}
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    assert cm["data"]["alert_relay.py"] == (ROOT / "runtime" / "alert_relay.py").read_text()
    assert json.loads(cm["data"]["routes.json"])["ops-feishu"]["kind"] == "feishu"
    pol = next(o for o in objs if o["kind"] == "NetworkPolicy")
    assert pol["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": alerting.ALERTMANAGER_POD_LABELS}}]


def test_every_inhibition_names_shipped_alerts():
    s = stacks.load("prod")
    ctx = build_context(build_plan(s), image_repository="r.internal/x/y")
    shipped = set(monitoring.alert_names(ctx))
    for cause, (targets, _) in alerting.DEPENDENTS.items():
        assert cause in shipped and set(targets) <= shipped, (cause, targets)


BAD = [
    ({"critical": ["pager"]}, "alerting.critical[0]", "not a receiver"),
    ({"receivers": {"x": {}}, "critical": []}, "alerting.receivers.x.webhook", "exactly one of"),
    ({"receivers": {"x": {"email": {"to": ["a@b.internal"], "sender": "c@d.internal", "smarthost": "smtp:587",
                                    "username": "u"}}}}, "alerting.receivers.x.email.password", "go together"),
    ({"receivers": {"x": {"email": {"to": ["nobody"], "sender": "c@d.internal", "smarthost": "smtp:587"}}}},
     "alerting.receivers.x.email.to.0", "pattern"),
]


@pytest.mark.parametrize("alerting_, path, expected", BAD, ids=[b[1] for b in BAD])
def test_bad_alerting_settings_name_the_field(alerting_, path, expected):
    raw = filled_raw("prod")
    raw["alerting"] = {**raw["alerting"], **alerting_}
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, "prod", stack="prod")
    line = next((p for p in info.value.problems if p.startswith(path)), None)
    assert line is not None and expected in line, info.value.problems


# --------------------------------------------------------------------------- amtool


def _with_email() -> stacks.StackSettings:
    raw = filled_raw("prod")
    raw["alerting"]["receivers"]["ops-mail"] = {"email": {
        "to": ["oncall@corp.internal"], "sender": "alertmanager@corp.internal", "smarthost": "smtp.corp.internal:587",
        "username": "alertmanager", "password": {"secret": "alerting-smtp", "key": "password"}}}
    raw["alerting"]["warning"] = ["ops-feishu", "ops-mail"]
    return parse(raw, "prod", stack="prod")


@pytest.mark.integration
@pytest.mark.parametrize("which", ["dev", "staging", "prod", "prod+email"])
def test_amtool_accepts_the_rendered_configuration(which, tmp_path):
    s = _with_email() if which == "prod+email" else stacks.load(which)
    res = subprocess.run([_tool("amtool"), "check-config", str(_write_config(alerting.config(s), tmp_path))],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(s.alerting.receivers) + 1} receivers" in res.stdout


@pytest.mark.integration
def test_a_critical_pages_and_a_warning_does_not(tmp_path):
    s = _with_email()
    cfg = _write_config(alerting.config(s), tmp_path)
    crit = _routes(cfg, "severity=critical", "alertname=VllmErrorRateHigh", "namespace=deepseek-serving")
    warn = _routes(cfg, "severity=warning", "alertname=VllmKVCacheHigh", "namespace=deepseek-serving")
    assert crit == ["oncall", "ops-feishu"]
    assert "oncall" not in warn and warn == ["ops-feishu", "ops-mail"]
    # the Watchdog goes to the dead man's switch alone, as a heartbeat every few minutes
    assert _routes(cfg, "alertname=Watchdog", "severity=none") == ["deadman"]
    (dog,) = [r for r in alerting.config(s)["route"]["routes"] if r["matchers"] == ['alertname="Watchdog"']]
    assert dog["repeat_interval"] == f"{s.alerting.watchdog_repeat_minutes}m" == "5m"
    assert _routes(cfg, "alertname=InfoInhibitor", "severity=none") == ["null"]
    assert _routes(cfg, "severity=info", "alertname=KubeletTooManyPods") == ["null"]
    # the password is read from the mounted Secret, never written into the configuration
    mail = next(r for r in alerting.config(s)["receivers"] if r["name"] == "ops-mail")["email_configs"][0]
    assert mail["auth_password_file"] == "/etc/alertmanager/secrets/alerting-smtp/password"
    assert alerting.chart_values(s)["alertmanager"]["alertmanagerSpec"]["secrets"] == ["alerting-smtp"]


@pytest.mark.integration
def test_the_watchdog_goes_nowhere_only_when_no_dead_mans_switch_is_named(tmp_path):
    raw = filled_raw("prod")
    raw["alerting"].pop("watchdog")
    cfg = _write_config(alerting.config(parse(raw, "prod", stack="prod")), tmp_path)
    assert _routes(cfg, "alertname=Watchdog", "severity=none") == ["null"]
    raw["alerting"]["watchdog"] = "pager"
    with pytest.raises(SettingsError) as info:
        parse(raw, "prod", stack="prod")
    assert any(p.startswith("alerting.watchdog") and "not a receiver" in p for p in info.value.problems), \
        info.value.problems


@pytest.mark.integration
def test_amtool_sees_a_critical_going_nowhere_when_no_pager_is_named(tmp_path):
    raw = filled_raw("prod")
    raw["alerting"]["critical"] = []
    cfg = _write_config(alerting.config(parse(raw, "prod", stack="prod")), tmp_path)
    assert _routes(cfg, "severity=critical", "alertname=VllmErrorRateHigh") == ["null"]


# --------------------------------------------------------------------------- a real Alertmanager




class _Sink:
    """A local HTTP endpoint that records what it is sent (a webhook, or a Feishu bot)."""

    def __init__(self, answer: dict | None = None):
        self.received: list[dict] = []
        sink = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                sink.received.append(body)
                data = json.dumps(answer or {}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _wait(url: str, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


def _post_alerts(am: str, alerts: list[dict]) -> None:
    req = urllib.request.Request(f"{am}/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()


def _until(pred, seconds: float = 30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    return pred()


@pytest.fixture
def delivery(tmp_path):
    """Real Alertmanager -> real relay -> local webhook and Feishu endpoints."""
    s = stacks.load("prod")
    oncall, feishu, deadman = _Sink(), _Sink(answer={"code": 0, "msg": "success"}), _Sink()
    signing_key = "test-signing-key"
    relay_port, am_port = _free_port(), _free_port()
    routes, env = alerting.relay_routes(s)
    (tmp_path / "routes.json").write_text(json.dumps(routes))
    relay_env = {**os.environ, "ALERT_RELAY_ROUTES": str(tmp_path / "routes.json"),
                 "ALERT_RELAY_HOST": "127.0.0.1", "ALERT_RELAY_PORT": str(relay_port),
                 "RELAY_ONCALL_URL": oncall.url, "RELAY_OPS_FEISHU_URL": feishu.url, "RELAY_DEADMAN_URL": deadman.url,
                 "RELAY_OPS_FEISHU_SIGNING_KEY": signing_key}
    assert {e["name"] for e in env} <= set(relay_env)
    procs = [subprocess.Popen([sys.executable, str(ROOT / "runtime" / "alert_relay.py")], env=relay_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    cfg = copy.deepcopy(alerting.config(s))
    for r in cfg["receivers"]:
        for hook in r.get("webhook_configs", []):
            hook["url"] = hook["url"].replace(f"http://{alerting.RELAY_NAME}:{alerting.RELAY_PORT}",
                                              f"http://127.0.0.1:{relay_port}")
    cfg["route"].update(group_wait="1s", group_interval="1s")
    conf = _write_config(cfg, tmp_path)
    procs.append(subprocess.Popen(
        [_tool("prometheus-alertmanager"), f"--config.file={conf}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    am = f"http://127.0.0.1:{am_port}"
    try:
        _wait(f"{am}/-/ready")
        _wait(f"http://127.0.0.1:{relay_port}/healthz")
        yield {"am": am, "oncall": oncall, "feishu": feishu, "deadman": deadman, "key": signing_key}
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        oncall.server.shutdown()
        feishu.server.shutdown()
        deadman.server.shutdown()


def _alert(name: str, severity: str, **labels) -> dict:
    return {"labels": {"alertname": name, "severity": severity, "namespace": "deepseek-serving", **labels},
            "annotations": {"summary": f"{name} on {labels.get('pod', 'the release')}"}}


@pytest.mark.integration
def test_a_critical_alert_reaches_the_pager_and_a_warning_only_the_chat(delivery):
    _post_alerts(delivery["am"], [_alert("VllmErrorRateHigh", "critical"),
                                  _alert("VllmPreemptionsRising", "warning", pod="deepseek-a")])
    oncall, feishu = delivery["oncall"], delivery["feishu"]
    assert _until(lambda: oncall.received), "the critical never reached the webhook receiver"
    got = _until(lambda: len(feishu.received) >= 2 and feishu.received)
    assert got, f"Feishu got {feishu.received}"
    time.sleep(2)  # room for a wrongly routed warning to arrive
    paged = {a["labels"]["alertname"] for m in oncall.received for a in m["alerts"]}
    assert paged == {"VllmErrorRateHigh"}  # the warning did not page
    assert oncall.received[0]["receiver"] == "oncall" and oncall.received[0]["version"] == "4"
    texts = "\n".join(m["content"]["text"] for m in feishu.received)
    assert "[FIRING:1] VllmErrorRateHigh (critical)" in texts and "VllmPreemptionsRising" in texts
    for m in feishu.received:  # signed with the bot's key, as Feishu verifies it
        assert m["msg_type"] == "text"
        assert m["sign"] == alert_relay.feishu_sign(delivery["key"], int(m["timestamp"]))


@pytest.mark.integration
def test_the_watchdog_reaches_the_dead_mans_switch_and_nobody_else(delivery):
    dog = {"labels": {"alertname": "Watchdog", "severity": "none"},
           "annotations": {"summary": "An alert that should always be firing"}}
    _post_alerts(delivery["am"], [dog])
    got = _until(lambda: delivery["deadman"].received)
    assert got and got[0]["receiver"] == "deadman" and got[0]["alerts"][0]["labels"]["alertname"] == "Watchdog"
    time.sleep(2)
    assert not delivery["oncall"].received and not delivery["feishu"].received


@pytest.mark.integration
def test_a_cause_inhibits_the_alerts_it_makes_redundant(delivery):
    am = delivery["am"]
    _post_alerts(am, [
        _alert("VllmTargetDown", "critical", pod="deepseek-a"),
        _alert("VllmKVCacheHigh", "warning", pod="deepseek-a", model_name="deepseek"),
        _alert("VllmKVCacheHigh", "warning", pod="deepseek-b", model_name="deepseek"),  # another pod
        _alert("VllmTimeToFirstTokenP99High", "critical", model_name="deepseek"),
        _alert("VllmEndToEndLatencyP99High", "warning", model_name="deepseek"),
    ])

    def states():
        alerts = json.loads(urllib.request.urlopen(f"{am}/api/v2/alerts", timeout=10).read())
        out = {(a["labels"]["alertname"], a["labels"].get("pod")): a["status"] for a in alerts}
        return out if len(out) == 5 and any(s["inhibitedBy"] for s in out.values()) else None

    got = _until(states)
    assert got, "alerts never showed up inhibited"
    assert got[("VllmKVCacheHigh", "deepseek-a")]["inhibitedBy"]
    assert got[("VllmKVCacheHigh", "deepseek-b")]["inhibitedBy"] == []  # its pod is up
    assert got[("VllmEndToEndLatencyP99High", None)]["inhibitedBy"]
    assert got[("VllmTargetDown", "deepseek-a")]["state"] == "active"
    time.sleep(2)
    told = "\n".join(m["content"]["text"] for m in delivery["feishu"].received)  # summaries name alert and pod
    assert "VllmKVCacheHigh on deepseek-a" not in told and "VllmEndToEndLatencyP99High" not in told
    assert "VllmKVCacheHigh on deepseek-b" in told


@pytest.mark.integration
def test_the_gateway_error_alert_yields_to_its_cause(delivery):
    am = delivery["am"]
    gw = {"labels": {"alertname": "GatewayErrorRateHigh", "severity": "critical"},
          "annotations": {"summary": "GatewayErrorRateHigh at the gateway"}}
    _post_alerts(am, [_alert("RateLimitStoreDown", "critical", deployment="envoy-ratelimit-redis"), gw])

    def gateway_state():
        alerts = json.loads(urllib.request.urlopen(f"{am}/api/v2/alerts", timeout=10).read())
        got = [a["status"] for a in alerts if a["labels"]["alertname"] == "GatewayErrorRateHigh"]
        return got if got and got[0]["inhibitedBy"] else None

    assert _until(gateway_state), "the gateway's error alert was not inhibited by its cause"


# --------------------------------------------------------------------------- the relay alone


def test_feishu_message_and_signature():
    payload = {"status": "firing", "commonLabels": {"alertname": "VllmErrorRateHigh", "severity": "critical"},
               "alerts": [{"labels": {"alertname": "VllmErrorRateHigh"}, "annotations": {"summary": "9% fail"}}]}
    msg = alert_relay.feishu_message(payload, "k", now=1700000000)
    assert msg["content"]["text"] == "[FIRING:1] VllmErrorRateHigh (critical)\n- 9% fail"
    # Feishu's custom-bot signature of timestamp 1700000000 and secret "k", computed by hand:
    # base64(HMAC-SHA256(key=b"1700000000\nk", msg=b""))
    import base64
    import hashlib
    import hmac
    expected = base64.b64encode(hmac.new(b"1700000000\nk", b"", hashlib.sha256).digest()).decode()
    assert msg == {**msg, "timestamp": "1700000000", "sign": expected}
    assert "sign" not in alert_relay.feishu_message(payload, None)


def test_relay_refuses_to_start_without_a_destination(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"x": {"kind": "webhook", "url_env": "NOPE"}}))
    with pytest.raises(ValueError, match="NOPE is empty"):
        alert_relay.load_routes(str(tmp_path / "r.json"), {})
