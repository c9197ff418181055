"""The TOS bucket that holds model weights, and the least-privilege identity that reads it.

The serving pods may read objects under one prefix and list that prefix, nothing else: no
wildcard actions, no write, no other bucket. Policy documents are built by pure functions
so tests (and the policy pack) can parse exactly what is sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list
from stacks import provider_changes
from stacks.constants import STS_AUDIENCE

IAM_ROLE = "volcengine:iam/role:Role"

READ_ACTIONS = ("tos:GetObject",)
LIST_ACTIONS = ("tos:ListBucket",)
ACL_WRITE_ACTIONS = ("tos:PutBucketACL", "tos:PutObjectACL")
OIDC_AUDIENCE = STS_AUDIENCE


def read_policy_document(bucket: str, prefix: str) -> dict:
    """GetObject on `trn:tos:::<bucket>/<prefix>/*`; ListBucket on the bucket limited to the
    prefix by `tos:prefix` (TOS resource names carry no `bucket/` segment, docs 6349/102133)."""
    prefix = prefix.strip("/")
    return {
        "Statement": [
            {
                "Sid": "ReadModelWeights",
                "Effect": "Allow",
                "Action": list(READ_ACTIONS),
                "Resource": [f"trn:tos:::{bucket}/{prefix}/*"],
            },
            {
                "Sid": "ListModelPrefix",
                "Effect": "Allow",
                "Action": list(LIST_ACTIONS),
                "Resource": [f"trn:tos:::{bucket}"],
                "Condition": {"StringLike": {"tos:prefix": [f"{prefix}/*"]}},
            },
        ]
    }


def irsa_trust_document(oidc_provider_trn: str, issuer: str, namespace: str, service_account: str,
                        *also: str) -> dict:
    """Only the serving ServiceAccount of this cluster (and `also`, the pre-warm's, which
    syncs the same weights) may assume the role: tokens issued by
    this cluster's issuer (`oidc:iss`, the provider URL VKE shows once IRSA is on), for STS
    (`oidc:aud`), naming the ServiceAccount (`oidc:sub`); docs 6460/1324613 lists the three
    keys. Empty values are refused: a role must never trust an empty principal."""
    missing = [k for k, v in (("oidc_provider_trn", oidc_provider_trn), ("issuer", issuer)) if not v]
    if missing:
        raise ValueError(f"IRSA trust policy without {' and '.join(missing)}: VKE reported no OIDC provider "
                         "for the cluster; run `pulumi up` again once the cluster shows IRSA enabled")
    return {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["sts:AssumeRoleWithOIDC"],
                "Principal": {"Federated": [oidc_provider_trn]},
                "Condition": {
                    "StringEquals": {
                        "oidc:iss": [issuer],
                        "oidc:aud": [OIDC_AUDIENCE],
                        "oidc:sub": [f"system:serviceaccount:{namespace}:{sa}" for sa in (service_account, *also)],
                    }
                },
            }
        ]
    }


def bucket_guard_document(bucket: str, deny_bucket_delete: bool) -> dict:
    """Defence in depth on the bucket itself: nobody may re-open it with an ACL, and in
    protected stacks nobody may delete it. Action names as TOS spells them (BytePlus TOS,
    "Templates and Parameters": PutBucketACL, PutObjectACL,
    https://docs.byteplus.com/zh-CN/docs/tos/docs-templates-and-parameters)."""
    statements = [
        {
            "Sid": "DenyAclChanges",
            "Effect": "Deny",
            "Principal": ["*"],
            "Action": list(ACL_WRITE_ACTIONS),
            "Resource": [f"trn:tos:::{bucket}", f"trn:tos:::{bucket}/*"],
        }
    ]
    if deny_bucket_delete:
        statements.append(
            {
                "Sid": "DenyBucketDelete",
                "Effect": "Deny",
                "Principal": ["*"],
                "Action": ["tos:DeleteBucket"],
                "Resource": [f"trn:tos:::{bucket}"],
            }
        )
    return {"Statement": statements}


@dataclass(frozen=True)
class WeightStoreArgs:
    bucket_name: str
    prefix: str
    noncurrent_version_days: int
    sse_algorithm: str
    kms_key_id: str | None
    irsa: bool
    # Phase 2 only (infra/identity.py): the reader identity exists once the cluster does.
    create_reader: bool
    oidc_provider_trn: pulumi.Input[str]
    oidc_issuer: pulumi.Input[str]
    namespace: str
    service_account: str
    protect: bool
    project_name: str
    tags: dict[str, str]
    # other ServiceAccounts of the namespace that read the weights (the pre-warm's)
    also_trusted: tuple[str, ...] = ()


class WeightStore(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    prefix: str
    role_name: pulumi.Output[str] | None  # None in phase 1: no reader identity yet
    role_trn: pulumi.Output[str] | None
    access_key_id: pulumi.Output[str] | None
    secret_access_key: pulumi.Output[str] | None

    def __init__(self, name: str, args: WeightStoreArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:weights:WeightStore", name, None, opts)
        bucket_name = args.bucket_name

        bucket = volc.tos.Bucket(
            f"{name}-bucket",
            bucket_name=bucket_name,
            public_acl="private",
            enable_version=True,
            storage_class="STANDARD",
            az_redundancy="multi-az",
            project_name=args.project_name,
            tags=tag_list(args.tags),
            opts=child(self, protect=args.protect),
        )
        sse: dict = {"sse_algorithm": args.sse_algorithm}
        if args.sse_algorithm == "kms":
            sse["kms_master_key_id"] = args.kms_key_id
        volc.tos.BucketEncryption(
            f"{name}-encryption",
            bucket_name=bucket.bucket_name,
            rule={"apply_server_side_encryption_by_default": sse},
            opts=child(self),
        )
        # Re-uploaded shards leave old versions behind; a 671B checkpoint is ~700 GB.
        volc.tos.BucketLifecycle(
            f"{name}-lifecycle",
            bucket_name=bucket.bucket_name,
            rules=[
                {
                    "id": "expire-noncurrent-versions",
                    "status": "Enabled",
                    "prefix": "",
                    "non_current_version_expiration": {"non_current_days": args.noncurrent_version_days},
                    "abort_incomplete_multipart_upload": {"days_after_initiation": 7},
                }
            ],
            opts=child(self),
        )
        volc.tos.BucketPolicy(
            f"{name}-bucket-policy",
            bucket_name=bucket.bucket_name,
            policy=json.dumps(bucket_guard_document(bucket_name, args.protect)),
            opts=child(self),
        )

        read_policy = volc.iam.Policy(
            f"{name}-read-policy",
            policy_name=f"{bucket_name}-read",
            description=f"read the model weights in {bucket_name}",
            policy_document=json.dumps(read_policy_document(bucket_name, args.prefix)),
            opts=child(self),
        )

        self.access_key_id = None
        self.secret_access_key = None
        self.role_name = None
        self.role_trn = None
        # Phase 1 creates no reader identity: with IRSA it needs the cluster's OIDC provider,
        # and nothing runs in the cluster yet to use either kind.
        if args.create_reader and args.irsa:
            trust = pulumi.Output.all(args.oidc_provider_trn, args.oidc_issuer).apply(
                lambda v: json.dumps(irsa_trust_document(v[0], v[1], args.namespace, args.service_account,
                                                         *args.also_trusted))
            )
            role = volc.iam.Role(
                f"{name}-reader-role",
                role_name=f"{bucket_name}-reader",
                display_name=f"{bucket_name} reader",
                description="assumed by the serving ServiceAccount through IRSA",
                trust_policy_document=trust,
                max_session_duration=3600,
                tags=tag_list(args.tags),
                # The pinned provider's UpdateRole never sends the trust policy
                # (stacks/provider_changes.yaml: trustPolicyDocument is `ignored`): a changed
                # issuer, namespace or service account would report success and keep the old
                # trust. Such a change replaces the role instead; the name is fixed, so the old
                # one goes first.
                opts=child(self, replace_on_changes=provider_changes.ignored(IAM_ROLE), delete_before_replace=True),
            )
            volc.iam.RolePolicyAttachment(
                f"{name}-reader-attach",
                role_name=role.role_name,
                policy_name=read_policy.policy_name,
                policy_type="Custom",
                opts=child(self),
            )
            self.role_name = role.role_name
            self.role_trn = role.trn
        elif args.create_reader:
            # Without IRSA the pods need a static credential: a dedicated IAM user that holds
            # the same read-only policy; its key goes into a Kubernetes Secret (workloads/).
            user = volc.iam.User(
                f"{name}-reader-user",
                user_name=f"{bucket_name}-reader",
                description="static reader for clusters without IRSA",
                opts=child(self),
            )
            volc.iam.UserPolicyAttachment(
                f"{name}-reader-user-attach",
                user_name=user.user_name,
                policy_name=read_policy.policy_name,
                policy_type="Custom",
                opts=child(self),
            )
            key = volc.iam.AccessKey(
                f"{name}-reader-key",
                user_name=user.user_name,
                opts=child(self, additional_secret_outputs=["secret_access_key"]),
            )
            self.role_name = user.user_name
            self.role_trn = user.trn
            self.access_key_id = key.access_key_id
            self.secret_access_key = pulumi.Output.secret(key.secret_access_key)

        self.bucket_name = bucket.bucket_name
        self.prefix = args.prefix
        outputs = {"bucket_name": self.bucket_name}
        if self.role_trn is not None:
            outputs.update(role_name=self.role_name, role_trn=self.role_trn)
        self.register_outputs(outputs)
