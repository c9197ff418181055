"""IAM: the serving identity reads one prefix of the weights bucket and nothing else."""

from __future__ import annotations

import re

from .common import (
    IAM_POLICY,
    IAM_ROLE,
    IAM_ROLE_ATTACH,
    IAM_USER_ATTACH,
    TOS_BUCKET,
    as_list,
    cfg,
    dig,
    json_doc,
    of_type,
    resource_policy,
    stack_policy,
    statements,
)

# Read-only TOS verbs: everything else (Put, Delete, Abort, Restore, ...) writes. A
# wildcard is read-only only when every action it matches is (`tos:Get*` yes, `tos:*` no).
READ_VERB = re.compile(r"^tos:(Get|List|Head)[A-Za-z*]*$")


def _wildcard_action(action: str) -> bool:
    return action == "*" or action.endswith(":*") or action.endswith("*")


def _no_wildcards(args, report):
    if args.resource_type != IAM_POLICY:
        return
    doc = json_doc(dig(args.props, "policyDocument"))
    for st in statements(doc):
        if st.get("Effect") != "Allow":
            continue
        bad = [a for a in as_list(st.get("Action")) if isinstance(a, str) and _wildcard_action(a)]
        if bad:
            report(f"policy {dig(args.props, 'policyName')!r} statement {st.get('Sid', '(no Sid)')!r} "
                   f"allows wildcard action(s) {', '.join(bad)}. Fix: list the exact actions "
                   "(tos:GetObject, tos:ListBucket) in infra/weights.py read_policy_document.")
        if "NotAction" in st:
            report(f"policy {dig(args.props, 'policyName')!r} uses NotAction in an Allow statement, which "
                   "grants every other action. Fix: use an explicit Action list.")


def _weights_scope(args, report):
    buckets = {str(dig(b.props, "bucketName", default="")) for b in of_type(args.resources, TOS_BUCKET)}
    prefix = str(cfg(args, "weightsPrefix", "models")).strip("/")
    for p in of_type(args.resources, IAM_POLICY):
        name = dig(p.props, "policyName")
        for st in statements(json_doc(dig(p.props, "policyDocument"))):
            if st.get("Effect") != "Allow":
                continue
            actions = [a for a in as_list(st.get("Action")) if isinstance(a, str)]
            if not any(a.startswith("tos:") or a == "*" for a in actions):
                continue
            for res in as_list(st.get("Resource")) or ["(none)"]:
                ok = False
                for b in buckets:
                    if res == f"trn:tos:::{b}":
                        # the bucket itself: listing only, and only under the prefix
                        cond = dig(st, "Condition", "StringLike", "tos:prefix")
                        prefixes = as_list(cond)
                        ok = all(a == "tos:ListBucket" for a in actions) and bool(prefixes) and all(
                            str(x).startswith(f"{prefix}/") for x in prefixes)
                    elif res.startswith(f"trn:tos:::{b}/{prefix}/"):
                        ok = True
                if not ok:
                    report(f"policy {name!r} grants {', '.join(actions)} on {res!r}, outside the weights "
                           f"bucket prefix ({', '.join(sorted(buckets)) or 'no bucket'} / {prefix}/). Fix: "
                           f"scope Resource to trn:tos:::<bucket>/{prefix}/* and list the bucket only with "
                           f"a tos:prefix condition '{prefix}/*'.", p.urn)


def _serving_identity_policies(resources) -> list:
    """Policies attached to an identity that Kubernetes pods use: a role assumed through
    IRSA (trust names system:serviceaccount:...) or the static reader user."""
    roles = {}
    for r in of_type(resources, IAM_ROLE):
        trust = json_doc(dig(r.props, "trustPolicyDocument"))
        if "system:serviceaccount:" in str(trust):
            roles[str(dig(r.props, "roleName", default=""))] = r
    names = set()
    for a in of_type(resources, IAM_ROLE_ATTACH):
        if str(dig(a.props, "roleName", default="")) in roles:
            names.add(str(dig(a.props, "policyName", default="")))
    for a in of_type(resources, IAM_USER_ATTACH):
        names.add(str(dig(a.props, "policyName", default="")))
    return [p for p in of_type(resources, IAM_POLICY) if str(dig(p.props, "policyName", default="")) in names]


def _serving_read_only(args, report):
    for p in _serving_identity_policies(args.resources):
        for st in statements(json_doc(dig(p.props, "policyDocument"))):
            if st.get("Effect") != "Allow":
                continue
            writes = [a for a in as_list(st.get("Action")) if isinstance(a, str) and not READ_VERB.match(a)]
            if writes:
                report(f"policy {dig(p.props, 'policyName')!r}, attached to the serving identity, allows "
                       f"{', '.join(writes)}. Fix: the serving pods only read weights; keep tos:GetObject "
                       "and tos:ListBucket and move uploads to a separate publisher identity.", p.urn)


def _trust_scoped(args, report):
    if args.resource_type != IAM_ROLE:
        return
    for st in statements(json_doc(dig(args.props, "trustPolicyDocument"))):
        if "sts:AssumeRoleWithOIDC" not in as_list(st.get("Action")) or st.get("Effect") != "Allow":
            continue
        role = dig(args.props, "roleName")
        federated = [str(p) for p in as_list(dig(st, "Principal", "Federated"))]
        if not federated or any(not p.strip() or "*" in p for p in federated):
            report(f"role {role!r} trusts OIDC provider(s) {federated}: an empty or wildcard principal. Fix: create "
                   "the role only once VKE reports the cluster's OIDC provider (deploy phase 2, infra/identity.py).")
        cond = dig(st, "Condition", "StringEquals", default={})
        subs = [str(s) for s in as_list(dig(cond, "oidc:sub"))]
        auds = as_list(dig(cond, "oidc:aud"))
        issuers = [str(i) for i in as_list(dig(cond, "oidc:iss"))]
        if not subs or any("*" in s or not s.startswith("system:serviceaccount:") for s in subs) or not auds:
            report(f"role {role!r} can be assumed through OIDC without an exact "
                   "oidc:sub (system:serviceaccount:<namespace>:<name>) and oidc:aud condition, so any pod of "
                   "the cluster could read the weights. Fix: add StringEquals conditions on oidc:sub and "
                   "oidc:aud (infra/weights.py irsa_trust_document).")
        if not issuers or any(not i.startswith("https://") for i in issuers):
            report(f"role {role!r} does not pin the token issuer (oidc:iss {issuers}): the trust names no cluster. "
                   "Fix: add a StringEquals condition on oidc:iss with the cluster's OIDC issuer URL "
                   "(docs 6460/1324613; infra/weights.py irsa_trust_document).")


POLICIES = [
    resource_policy(
        "iam-no-wildcard-actions",
        "IAM policies must not allow wildcard actions ('*', 'tos:*', 'iam:*', ...).",
        _no_wildcards,
        fix="List the exact actions the identity needs.",
        tags=["iam"],
    ),
    stack_policy(
        "iam-weights-bucket-scope",
        "IAM grants on TOS must be scoped to the stack's weights bucket and prefix.",
        _weights_scope,
        fix="Scope Resource to trn:tos:::<bucket>/<prefix>/* (and the bucket with a tos:prefix condition).",
        config={"weightsPrefix": {"type": "string", "default": "models",
                                  "description": "key prefix the serving identity may read (weights.prefix)"}},
        tags=["iam"],
    ),
    stack_policy(
        "iam-serving-read-only",
        "The serving identity must hold read-only TOS actions.",
        _serving_read_only,
        fix="Keep only tos:GetObject and tos:ListBucket on the serving role's policy.",
        tags=["iam"],
    ),
    resource_policy(
        "iam-oidc-trust-scoped",
        "Roles assumed through OIDC trust a real provider and name its issuer, the STS audience and one "
        "ServiceAccount.",
        _trust_scoped,
        fix="Add StringEquals conditions on oidc:iss, oidc:aud and oidc:sub; create the role in deploy phase 2.",
        tags=["iam"],
    ),
]
