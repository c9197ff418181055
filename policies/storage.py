"""TOS: the weight bucket is private, encrypted and (in prod) versioned."""

from __future__ import annotations

from .common import (
    TOS_BUCKET,
    TOS_BUCKET_ENCRYPTION,
    TOS_BUCKET_POLICY,
    as_list,
    cfg,
    dig,
    json_doc,
    of_type,
    resource_policy,
    stack_policy,
    statements,
)

PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read", "bucket-owner-read")
SSE_ALGORITHMS = ("AES256", "kms")


def _bucket_private(args, report):
    if args.resource_type != TOS_BUCKET:
        return
    acl = dig(args.props, "publicAcl", default="private")
    if acl != "private":
        report(f"bucket {dig(args.props, 'bucketName')!r} has ACL {acl!r}, which lets anyone read model "
               "weights. Fix: set public_acl='private' on the tos.Bucket (infra/weights.py); grant "
               "access through the IAM reader role instead.")


def _bucket_policy_public(args, report):
    if args.resource_type != TOS_BUCKET_POLICY:
        return
    for st in statements(json_doc(dig(args.props, "policy"))):
        if st.get("Effect") != "Allow":
            continue
        principal = st.get("Principal")
        principals = as_list(principal.get("TOS") if isinstance(principal, dict) else principal)
        if "*" in principals:
            report(f"bucket policy statement {st.get('Sid', '(no Sid)')!r} allows {st.get('Action')} to "
                   "Principal '*'. Fix: remove the statement or name the account/role that needs access; "
                   "public grants belong in Deny statements only.")


def _bucket_encrypted(args, report):
    buckets = of_type(args.resources, TOS_BUCKET)
    encrypted: dict[str, str] = {}
    for enc in of_type(args.resources, TOS_BUCKET_ENCRYPTION):
        algo = dig(enc.props, "rule", "applyServerSideEncryptionByDefault", "sseAlgorithm", default="")
        encrypted[str(dig(enc.props, "bucketName", default=""))] = str(algo)
    for b in buckets:
        name = str(dig(b.props, "bucketName", default=""))
        algo = encrypted.get(name)
        if algo is None:
            report(f"bucket {name!r} has no tos.BucketEncryption. Fix: add a BucketEncryption with "
                   "rule.apply_server_side_encryption_by_default.sse_algorithm 'AES256' or 'kms' "
                   "(weights.sse_algorithm).", b.urn)
        elif algo not in SSE_ALGORITHMS:
            report(f"bucket {name!r} has a BucketEncryption with algorithm {algo or '(none)'!r}, which encrypts "
                   f"nothing. Fix: set sse_algorithm to "
                   f"one of {', '.join(SSE_ALGORITHMS)} (weights.sse_algorithm).", b.urn)


def _bucket_versioned(args, report):
    if args.resource_type != TOS_BUCKET:
        return
    if not cfg(args, "required", True):
        args.not_applicable("versioning not required by this stack's policy config")
    if dig(args.props, "enableVersion", default=False) is not True:
        report(f"bucket {dig(args.props, 'bucketName')!r} is not versioned: an overwritten or deleted "
               "shard cannot be recovered. Fix: set enable_version=True on the tos.Bucket.")


POLICIES = [
    resource_policy(
        "tos-bucket-not-public",
        "TOS buckets must be private (ACL 'private').",
        _bucket_private,
        fix="Set public_acl='private'; serve weights through the IAM reader role.",
        tags=["storage"],
    ),
    resource_policy(
        "tos-bucket-policy-no-public-allow",
        "TOS bucket policies must not allow anything to Principal '*'.",
        _bucket_policy_public,
        fix="Replace Principal '*' in Allow statements with the account or role that needs access.",
        tags=["storage"],
    ),
    stack_policy(
        "tos-bucket-encrypted",
        "Every TOS bucket must have server-side encryption (AES256 or KMS).",
        _bucket_encrypted,
        fix="Add a tos.BucketEncryption for the bucket with sse_algorithm AES256 or kms.",
        tags=["storage"],
    ),
    resource_policy(
        "tos-bucket-versioned",
        "TOS buckets must keep object versions (required in prod).",
        _bucket_versioned,
        fix="Set enable_version=True on the tos.Bucket.",
        config={"required": {"type": "boolean", "default": True,
                             "description": "whether this stack requires versioning"}},
        tags=["storage"],
    ),
]
