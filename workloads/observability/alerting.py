"""Alert delivery: Alertmanager's receivers, routes and inhibitions from `settings.alerting`.

    chart_values(settings) -> dict   kube-prometheus-stack values (alertmanager.config, secrets)
    config(settings) -> dict         the Alertmanager configuration itself (what amtool checks)
    relay(settings) -> list[dict]    the alert relay for webhook and Feishu receivers

Routing is by the `severity` label every shipped alert carries: `critical` goes to the
receivers named in `alerting.critical` (the pager), `warning` to `alerting.warning`; one
route per receiver with `continue: true`, so an alert reaches each receiver of its
severity. kube-prometheus-stack's Watchdog (an always-firing dead man's switch meant for an
external heartbeat) and InfoInhibitor go nowhere; anything else unmatched goes nowhere
either ("null").

Secrets never enter the configuration: webhook and Feishu receivers point Alertmanager at
the in-cluster relay (runtime/alert_relay.py), which reads each destination URL and
signing key from the Secrets the settings name; an e-mail password is read by Alertmanager
from the Secret mounted at /etc/alertmanager/secrets/<secret>/<key> (`auth_password_file`).

Inhibitions keep one cause from paging as many alerts: a critical silences the warning of
the same alert, and the causes in `DEPENDENTS` silence the alerts that follow from them.
"""

from __future__ import annotations

from importlib import resources

from stacks.constants import MANAGED_BY, PART_OF
from stacks.settings import StackSettings
from workloads.supply_chain import versions

RELAY_NAME = "alert-relay"
RELAY_PORT = 8080
RELAY_ROUTES_FILE = "routes.json"
RELAY_DIR = "/opt/alert-relay"
SECRETS_DIR = "/etc/alertmanager/secrets"  # where the operator mounts alertmanagerSpec.secrets
NULL = "null"
SEVERITIES = ("critical", "warning")
# Labels prometheus-operator puts on the Alertmanager pods it runs.
ALERTMANAGER_POD_LABELS = {"app.kubernetes.io/name": "alertmanager",
                           "app.kubernetes.io/managed-by": "prometheus-operator"}

GROUP_BY = ["alertname", "namespace", "model_name"]
GROUP_WAIT = "30s"
GROUP_INTERVAL = "5m"

# cause -> (alerts it makes redundant, labels that must match). Only alerts of the same
# place are silenced: the same pod, or the same model of the same namespace.
DEPENDENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # Prometheus cannot scrape the pod: every alert computed from that pod's metrics is
    # stale or absent. Restarts and OOM kills (kube-state-metrics) still tell why.
    "VllmTargetDown": (("VllmKVCacheHigh", "VllmPreemptionsRising", "VllmQueueGrowingWhileKVCacheFull"),
                       ("namespace", "pod")),
    # A growing queue with a full cache already says the cache is full and preempting.
    "VllmQueueGrowingWhileKVCacheFull": (("VllmKVCacheHigh", "VllmPreemptionsRising"), ("namespace", "pod")),
    # Slow first tokens make whole requests slow and look like a regression.
    "VllmTimeToFirstTokenP99High": (("VllmEndToEndLatencyP99High", "VllmLatencyP99Regression"),
                                    ("namespace", "model_name")),
    # Slowly flowing tokens make whole requests slow.
    "VllmTokenRateLow": (("VllmEndToEndLatencyP99High",), ("namespace", "model_name")),
    # An OOM kill is a restart with its reason.
    "VllmPodOOMKilled": (("VllmPodRestarting",), ("namespace", "pod", "container")),
    # vLLM's own 5xx, and the fail-closed rate limit's 500s, are what the gateway's error
    # ratio then counts: page for the cause. (The gateway's series carry no namespace; one
    # stack per cluster, so no label needs to match.)
    "VllmErrorRateHigh": (("GatewayErrorRateHigh",), ()),
    "RateLimitStoreDown": (("GatewayErrorRateHigh",), ()),
}


def _relay_url(receiver: str) -> str:
    return f"http://{RELAY_NAME}:{RELAY_PORT}/{receiver}"


def _secret_file(ref) -> str:
    return f"{SECRETS_DIR}/{ref.secret}/{ref.key}"


def receiver_config(name: str, settings: StackSettings) -> dict:
    r = settings.alerting.receivers[name]
    if r.email is not None:
        e = r.email
        email = {"to": ", ".join(e.to), "from": e.sender, "smarthost": e.smarthost,
                 "require_tls": e.require_tls, "send_resolved": True}
        if e.username is not None and e.password is not None:
            email.update(auth_username=e.username, auth_password_file=_secret_file(e.password))
        return {"name": name, "email_configs": [email]}
    # webhook and Feishu go through the relay, which holds their URLs; the relay lives in
    # Alertmanager's namespace, so its short Service name resolves.
    return {"name": name, "webhook_configs": [{"url": _relay_url(name), "send_resolved": True}]}


def inhibit_rules() -> list[dict]:
    rules = [{
        # The same alert at both severities (kube-prometheus' cluster alerts do this).
        "source_matchers": ['severity="critical"'],
        "target_matchers": ['severity="warning"'],
        "equal": ["alertname", "namespace"],
    }]
    for cause, (targets, equal) in DEPENDENTS.items():
        rules.append({
            "source_matchers": [f'alertname="{cause}"'],
            "target_matchers": [f'alertname=~"{"|".join(targets)}"'],
            "equal": list(equal),
        })
    return rules


def config(settings: StackSettings) -> dict:
    a = settings.alerting
    repeat = {"critical": a.critical_repeat_minutes, "warning": a.warning_repeat_minutes}
    routes: list[dict] = []
    if a.watchdog is not None:
        # Sent at once and again every few minutes, alone: a heartbeat, not a notification.
        routes.append({"matchers": ['alertname="Watchdog"'], "receiver": a.watchdog, "group_by": ["alertname"],
                       "group_wait": "0s", "group_interval": "1m", "repeat_interval": f"{a.watchdog_repeat_minutes}m"})
    routes.append({"matchers": ['alertname=~"Watchdog|InfoInhibitor"'], "receiver": NULL})
    for sev in SEVERITIES:
        for name in getattr(a, sev):
            routes.append({"matchers": [f'severity="{sev}"'], "receiver": name, "continue": True,
                           "repeat_interval": f"{repeat[sev]}m"})
    return {
        "global": {"resolve_timeout": "5m"},
        "route": {"receiver": NULL, "group_by": list(GROUP_BY), "group_wait": GROUP_WAIT,
                  "group_interval": GROUP_INTERVAL, "repeat_interval": f"{a.warning_repeat_minutes}m",
                  "routes": routes},
        "receivers": [{"name": NULL}] + [receiver_config(n, settings) for n in a.receivers],
        "inhibit_rules": inhibit_rules(),
        "templates": [],
    }


def mounted_secrets(settings: StackSettings) -> list[str]:
    """Secrets Alertmanager reads files from (e-mail passwords)."""
    out = []
    for r in settings.alerting.receivers.values():
        if r.email is not None and r.email.password is not None and r.email.password.secret not in out:
            out.append(r.email.password.secret)
    return out


def chart_values(settings: StackSettings) -> dict:
    spec: dict = {}
    if mounted_secrets(settings):
        spec["secrets"] = mounted_secrets(settings)
    values: dict = {"config": config(settings)}
    if spec:
        values["alertmanagerSpec"] = spec
    return {"alertmanager": values}


# --------------------------------------------------------------------------- relay


def relayed(settings: StackSettings) -> dict[str, object]:
    """Receivers the relay forwards for (webhook and Feishu)."""
    return {n: r for n, r in settings.alerting.receivers.items() if r.email is None}


def _env_name(receiver: str, what: str) -> str:
    return f"RELAY_{receiver.upper().replace('-', '_')}_{what}"


def relay_routes(settings: StackSettings) -> tuple[dict, list[dict]]:
    """(routes file content, container env) of the relay."""
    routes, env = {}, []
    for name, r in relayed(settings).items():
        url = r.webhook.url if r.webhook is not None else r.feishu.webhook
        spec = {"kind": "webhook" if r.webhook is not None else "feishu", "url_env": _env_name(name, "URL")}
        env.append({"name": spec["url_env"],
                    "valueFrom": {"secretKeyRef": {"name": url.secret, "key": url.key}}})
        if r.feishu is not None and r.feishu.signing_key is not None:
            spec["signing_key_env"] = _env_name(name, "SIGNING_KEY")
            env.append({"name": spec["signing_key_env"], "valueFrom": {"secretKeyRef": {
                "name": r.feishu.signing_key.secret, "key": r.feishu.signing_key.key}}})
        routes[name] = spec
    return routes, env


def relay_source() -> str:
    return resources.files("runtime").joinpath("alert_relay.py").read_text()


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": RELAY_NAME, "app.kubernetes.io/instance": RELAY_NAME,
            "app.kubernetes.io/component": "alerting", "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": MANAGED_BY}


def relay(settings: StackSettings, image: str | None = None) -> list[dict]:
    """ConfigMap (code + routes), Deployment, Service and NetworkPolicy of the relay; none
    when no receiver needs it."""
    import json

    if not settings.monitoring.enabled or not relayed(settings):
        return []
    ns = settings.monitoring.namespace
    labels = _labels()
    selector = {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
    md = {"name": RELAY_NAME, "namespace": ns, "labels": labels}
    routes, env = relay_routes(settings)
    container = {
        "name": RELAY_NAME,
        "image": image or versions.ALERT_RELAY_IMAGE,
        "command": ["python3", f"{RELAY_DIR}/alert_relay.py"],
        "env": [{"name": "ALERT_RELAY_ROUTES", "value": f"{RELAY_DIR}/{RELAY_ROUTES_FILE}"},
                {"name": "ALERT_RELAY_PORT", "value": str(RELAY_PORT)}, *env],
        "ports": [{"name": "http", "containerPort": RELAY_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 20},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "relay", "mountPath": RELAY_DIR, "readOnly": True}],
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md,
         "data": {"alert_relay.py": relay_source(), RELAY_ROUTES_FILE: json.dumps(routes, indent=1, sort_keys=True)}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": md, "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": {
                "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
                "volumes": [{"name": "relay", "configMap": {"name": RELAY_NAME}}],
            }},
        }},
        {"apiVersion": "v1", "kind": "Service", "metadata": md, "spec": {
            "type": "ClusterIP", "selector": selector,
            "ports": [{"name": "http", "port": RELAY_PORT, "targetPort": "http", "protocol": "TCP"}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": md, "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Ingress", "Egress"],
            # only Alertmanager posts to it ...
            "ingress": [{"from": [{"podSelector": {"matchLabels": dict(ALERTMANAGER_POD_LABELS)}}],
                         "ports": [{"protocol": "TCP", "port": RELAY_PORT}]}],
            # ... and it reaches DNS and HTTPS (Feishu and webhook destinations are outside).
            "egress": [
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"ports": [{"protocol": "TCP", "port": 443}]},
            ],
        }},
    ]
