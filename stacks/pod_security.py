"""The Kubernetes Pod Security Standards as a pure-Python check of a pod spec.

    findings(spec, metadata, version) -> list[Finding]   every control the pod breaks
    meets(spec, metadata, level, version) -> list[Finding] the controls that keep it from `level`
    strictest_level(pods, version) -> str                  the strictest level all pods meet

The controls and their allowed values are those of the Pod Security Standards page
(https://kubernetes.io/docs/concepts/security/pod-security-standards/) as Pod Security
Admission enforces them at a policy version (the `pod-security.kubernetes.io/enforce-version`
label): the levels `baseline` and `restricted` (`privileged` allows everything). Read at
kubernetes/pod-security-admission v0.32.13 (commit b314c21f381785a2f50f2b327d9403acdc89440d),
policy/check_*.go, for which version each control takes effect and the values it allows;
tests/test_pod_security.py checks this module against that release's own pass/fail pod
fixtures for v1.32 (tests/data/pod-security, SOURCES.md).

Check ids are upstream's (`hostPathVolumes`, `capabilities_restricted`, ...). A restricted
control that replaces a baseline one at the restricted level (restrictedVolumes replaces
hostPathVolumes, capabilities_restricted replaces capabilities_baseline,
seccompProfile_restricted replaces seccompProfile_baseline) is evaluated instead of it
there, as Pod Security Admission does.

Not modelled: the relaxations for pods in a user namespace (`hostUsers: false`), which are
behind a feature gate in 1.32, and ephemeral containers' own rules beyond visiting them.

Works on plain dicts and on any Mapping/Sequence (pulumi_policy's property proxies).
May import: nothing of the project.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Iterable

LEVELS = ("privileged", "baseline", "restricted")  # weakest to strictest
BASELINE, RESTRICTED = "baseline", "restricted"

_BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
_SAFE_SYSCTLS = (  # (from version, names added)
    ((1, 0), {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
              "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"}),
    ((1, 27), {"net.ipv4.ip_local_reserved_ports"}),
    ((1, 29), {"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
               "net.ipv4.tcp_keepalive_probes"}),
    ((1, 32), {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}),
)
_SELINUX_TYPES = (((1, 0), {"", "container_t", "container_init_t", "container_kvm_t"}),
                  ((1, 31), {"container_engine_t"}))
_RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret")
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_SECCOMP_OK = ("RuntimeDefault", "Localhost")
_REPLACED_AT_RESTRICTED = {"hostPathVolumes": "restrictedVolumes", "capabilities_baseline": "capabilities_restricted",
                           "seccompProfile_baseline": "seccompProfile_restricted"}


@dataclass(frozen=True)
class Finding:
    check: str  # upstream check id
    level: str  # the level the control belongs to: a pod with this finding does not meet it
    detail: str

    def __str__(self) -> str:
        return f"{self.check} ({self.level}): {self.detail}"


# --------------------------------------------------------------------------- reading


def _get(obj: Any, *path: Any, default: Any = None) -> Any:
    cur = obj
    for key in path:
        if isinstance(cur, Mapping) and key in cur:
            cur = cur[key]
        else:
            return default
    return default if cur is None else cur


def _list(obj: Any) -> list:
    if isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
        return [obj[i] for i in range(len(obj))]
    return []


def _containers(spec: Any) -> list:
    return [c for key in ("containers", "initContainers", "ephemeralContainers") for c in _list(_get(spec, key))]


def _name(c: Any) -> str:
    return str(_get(c, "name", default="?"))


def parse_version(version: str) -> tuple[int, int]:
    """`v1.32`, `1.32` -> (1, 32); `latest` -> a version newer than any."""
    text = str(version).strip().lstrip("v")
    if text == "latest":
        return (1, 10_000)
    major, _, minor = text.partition(".")
    try:
        return (int(major), int(minor))
    except ValueError:
        raise ValueError(f"Pod Security version: expected 'v<major>.<minor>' or 'latest', got {version!r}") from None


def _allowed(table, v: tuple[int, int]) -> set[str]:
    out: set[str] = set()
    for since, names in table:
        if v >= since:
            out |= names
    return out


# --------------------------------------------------------------------------- baseline


def _windows(spec: Any) -> bool:
    return _get(spec, "os", "name") == "windows"


def _baseline(spec: Any, md: Any, v: tuple[int, int]) -> list[Finding]:
    out: list[Finding] = []
    sc = _get(spec, "securityContext", default={})
    cs = _containers(spec)

    def add(check: str, detail: str) -> None:
        out.append(Finding(check, BASELINE, detail))

    host = [f for f in ("hostNetwork", "hostPID", "hostIPC") if _get(spec, f) is True]
    if host:
        add("hostNamespaces", f"{', '.join(host)} must not be true")
    bad = [_name(c) for c in cs if _get(c, "securityContext", "privileged") is True]
    if bad:
        add("privileged", f"containers {bad} must not set privileged: true")
    bad_caps: dict[str, list[str]] = {}
    for c in cs:
        extra = [str(x) for x in _list(_get(c, "securityContext", "capabilities", "add"))
                 if str(x) not in _BASELINE_CAPABILITIES]
        if extra:
            bad_caps[_name(c)] = extra
    if bad_caps:
        add("capabilities_baseline", f"capabilities.add beyond the default set: {bad_caps}")
    paths = [str(_get(vol, "name")) for vol in _list(_get(spec, "volumes")) if _get(vol, "hostPath") is not None]
    if paths:
        add("hostPathVolumes", f"hostPath volumes {paths} are not allowed")
    ports = sorted({int(_get(p, "hostPort")) for c in cs for p in _list(_get(c, "ports"))
                    if _get(p, "hostPort") not in (None, 0)})
    if ports:
        add("hostPorts", f"hostPort {ports} must not be set")
    # AppArmor: the field (pod or container) and the beta annotations
    bad_aa = [str(t) for t in [_get(sc, "appArmorProfile", "type")] + [
        _get(c, "securityContext", "appArmorProfile", "type") for c in cs] if t is not None and t not in _SECCOMP_OK]
    annotations = _get(md, "annotations", default={})
    bad_aa += [f"{k}={annotations[k]}" for k in (annotations if isinstance(annotations, Mapping) else {})
               if str(k).startswith(_APPARMOR_ANNOTATION)
               and not (annotations[k] in ("", "runtime/default") or str(annotations[k]).startswith("localhost/"))]
    if bad_aa:
        add("appArmorProfile", f"AppArmor profile must be RuntimeDefault or Localhost, got {bad_aa}")
    # SELinux
    types = _allowed(_SELINUX_TYPES, v)
    bad_se = []
    for who, opts in [("pod", _get(sc, "seLinuxOptions"))] + [(_name(c), _get(c, "securityContext", "seLinuxOptions"))
                                                             for c in cs]:
        if opts is None:
            continue
        if str(_get(opts, "type", default="")) not in types or _get(opts, "user") or _get(opts, "role"):
            bad_se.append(who)
    if bad_se:
        add("seLinuxOptions", f"seLinuxOptions of {bad_se}: type must be one of {sorted(types)}, no user or role")
    bad_pm = [_name(c) for c in cs if _get(c, "securityContext", "procMount") not in (None, "Default")]
    if bad_pm:
        add("procMount", f"containers {bad_pm} must not set procMount other than Default")
    # seccomp: never Unconfined (the field; the pre-1.19 annotations are not read from 1.19 on)
    bad_sc = [who for who, t in [("pod", _get(sc, "seccompProfile", "type"))] + [
        (_name(c), _get(c, "securityContext", "seccompProfile", "type")) for c in cs] if t is not None and t not in _SECCOMP_OK]
    if bad_sc:
        add("seccompProfile_baseline", f"seccompProfile of {bad_sc} must be RuntimeDefault or Localhost")
    safe = _allowed(_SAFE_SYSCTLS, v)
    bad_sysctl = [str(_get(s, "name")) for s in _list(_get(sc, "sysctls")) if str(_get(s, "name")) not in safe]
    if bad_sysctl:
        add("sysctls", f"unsafe sysctls {bad_sysctl}")
    hp = _get(sc, "windowsOptions", "hostProcess") is True or any(
        _get(c, "securityContext", "windowsOptions", "hostProcess") is True for c in cs)
    if hp:
        add("windowsHostProcess", "windowsOptions.hostProcess must not be true")
    return out


# --------------------------------------------------------------------------- restricted


def _restricted(spec: Any, v: tuple[int, int]) -> list[Finding]:
    out: list[Finding] = []
    sc = _get(spec, "securityContext", default={})
    cs = _containers(spec)
    windows = _windows(spec) and v >= (1, 25)

    def add(check: str, detail: str) -> None:
        out.append(Finding(check, RESTRICTED, detail))

    bad_vol = {}
    for vol in _list(_get(spec, "volumes")):
        kinds = [k for k in (vol if isinstance(vol, Mapping) else {}) if k != "name"]
        # a volume without a source is an emptyDir (the API server's default)
        if kinds and not any(k in _RESTRICTED_VOLUMES for k in kinds):
            bad_vol[str(_get(vol, "name"))] = kinds
    if bad_vol:
        add("restrictedVolumes", f"volume types other than {list(_RESTRICTED_VOLUMES)}: {bad_vol}")
    if not windows:
        bad = [_name(c) for c in cs if _get(c, "securityContext", "allowPrivilegeEscalation") is not False]
        if bad:
            add("allowPrivilegeEscalation", f"containers {bad} must set allowPrivilegeEscalation: false")
    pod_nonroot = _get(sc, "runAsNonRoot")
    explicit = [_name(c) for c in cs if _get(c, "securityContext", "runAsNonRoot") is False]
    implicit = [_name(c) for c in cs if _get(c, "securityContext", "runAsNonRoot") is None and pod_nonroot is not True]
    if pod_nonroot is False or explicit or implicit:
        add("runAsNonRoot", "runAsNonRoot must be true for the pod or every container"
            + (f" (not set for {implicit})" if implicit else "") + (f" (false for {explicit})" if explicit else ""))
    if v >= (1, 23):
        root = (["pod"] if _get(sc, "runAsUser") == 0 else []) + [
            _name(c) for c in cs if _get(c, "securityContext", "runAsUser") == 0]
        if root:
            add("runAsUser", f"runAsUser must not be 0 ({root})")
    if v >= (1, 19) and not windows:
        pod_type = _get(sc, "seccompProfile", "type")
        pod_ok = pod_type in _SECCOMP_OK
        bad = ([] if pod_type is None or pod_ok else ["pod"]) + [
            _name(c) for c in cs
            if (t := _get(c, "securityContext", "seccompProfile", "type")) is not None and t not in _SECCOMP_OK
            or t is None and not pod_ok]
        if bad:
            add("seccompProfile_restricted", f"seccompProfile must be RuntimeDefault or Localhost for {bad}")
    if v >= (1, 22) and not windows:
        no_drop = [_name(c) for c in cs
                   if "ALL" not in [str(x) for x in _list(_get(c, "securityContext", "capabilities", "drop"))]]
        adds = {_name(c): extra for c in cs if (extra := [
            str(x) for x in _list(_get(c, "securityContext", "capabilities", "add")) if str(x) != "NET_BIND_SERVICE"])}
        if no_drop or adds:
            add("capabilities_restricted", "containers must drop ALL and add nothing but NET_BIND_SERVICE"
                + (f"; no drop ALL: {no_drop}" if no_drop else "") + (f"; adds {adds}" if adds else ""))
    return out


# --------------------------------------------------------------------------- API


def findings(spec: Any, metadata: Any = None, version: str = "latest") -> list[Finding]:
    """Every control of the baseline and restricted levels that `spec` (a PodSpec: a pod's
    `spec` or a template's `spec`) breaks; `metadata` carries the annotations some controls
    read. A baseline control replaced at the restricted level is reported once, as the
    baseline finding."""
    v = parse_version(version)
    base = _baseline(spec, metadata or {}, v)
    found = {f.check for f in base}
    rest = [f for f in _restricted(spec, v)
            if not any(_REPLACED_AT_RESTRICTED.get(b) == f.check for b in found)]
    return base + rest


def meets(spec: Any, metadata: Any = None, level: str = RESTRICTED, version: str = "latest") -> list[Finding]:
    """The findings that keep the pod from `level` (empty: admitted at that level)."""
    if level not in LEVELS:
        raise ValueError(f"Pod Security level: expected one of {', '.join(LEVELS)}, got {level!r}")
    if level == "privileged":
        return []
    v = parse_version(version)
    if level == BASELINE:
        return _baseline(spec, metadata or {}, v)
    base = [f for f in _baseline(spec, metadata or {}, v) if f.check not in _REPLACED_AT_RESTRICTED]
    return base + _restricted(spec, v)


def strictest_level(pods: Iterable[tuple[Any, Any]], version: str = "latest") -> str:
    """The strictest level every (spec, metadata) pair meets; `restricted` for no pods."""
    pods = list(pods)
    for level in reversed(LEVELS):
        if all(not meets(spec, md, level, version) for spec, md in pods):
            return level
    return "privileged"


def weaker(a: str, b: str) -> bool:
    """Whether level `a` allows more than level `b`."""
    return LEVELS.index(a) < LEVELS.index(b)
