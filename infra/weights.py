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
from stacks.constants import STS_AUDIENCE

READ_ACTIONS = ("tos:GetObject",)
LIST_ACTIONS = ("tos:ListBucket",)
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


def irsa_trust_document(oidc_provider_trn: str, namespace: str, service_account: str) -> dict:
    """Only the serving ServiceAccount of this cluster may assume the role (docs 6460/1324604)."""
    return {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["sts:AssumeRoleWithOIDC"],
                "Principal": {"Federated": [oidc_provider_trn]},
                "Condition": {
                    "StringEquals": {
                        "oidc:aud": [OIDC_AUDIENCE],
                        "oidc:sub": [f"system:serviceaccount:{namespace}:{service_account}"],
                    }
                },
            }
        ]
    }


def bucket_guard_document(bucket: str, deny_bucket_delete: bool) -> dict:
    """Defence in depth on the bucket itself: nobody may re-open it with an ACL, and in
    protected stacks nobody may delete it."""
    statements = [
        {
            "Sid": "DenyAclChanges",
            "Effect": "Deny",
            "Principal": ["*"],
            "Action": ["tos:PutBucketAcl", "tos:PutObjectAcl"],
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
    oidc_provider_trn: pulumi.Input[str | None]  # None until IRSA is on
    namespace: str
    service_account: str
    protect: bool
    project_name: str
    tags: dict[str, str]


class WeightStore(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    prefix: str
    role_name: pulumi.Output[str]
    role_trn: pulumi.Output[str]
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
            description=f"read {args.prefix}/ of {bucket_name}",
            policy_document=json.dumps(read_policy_document(bucket_name, args.prefix)),
            opts=child(self),
        )

        self.access_key_id = None
        self.secret_access_key = None
        if args.irsa:
            # The role's trust names the cluster's OIDC provider, which VKE creates only when
            # IRSA is switched on, an update of an existing cluster. Until the provider is
            # known the role is not created (a trust without a principal is invalid); it is
            # created in the apply that first sees the provider. Interim: a phased design
            # with its own preview is tracked separately.
            def reader_role(trn: str | None) -> dict[str, object]:
                if not trn:
                    return {"name": "", "trn": ""}
                role = volc.iam.Role(
                    f"{name}-reader-role",
                    role_name=f"{bucket_name}-reader",
                    display_name=f"{bucket_name} reader",
                    description="assumed by the serving ServiceAccount through IRSA",
                    trust_policy_document=json.dumps(irsa_trust_document(trn, args.namespace, args.service_account)),
                    max_session_duration=3600,
                    tags=tag_list(args.tags),
                    opts=child(self),
                )
                volc.iam.RolePolicyAttachment(
                    f"{name}-reader-attach",
                    role_name=role.role_name,
                    policy_name=read_policy.policy_name,
                    policy_type="Custom",
                    opts=child(self),
                )
                return {"name": role.role_name, "trn": role.trn}

            role = pulumi.Output.from_input(args.oidc_provider_trn).apply(reader_role)
            self.role_name = role.apply(lambda r: r["name"])
            self.role_trn = role.apply(lambda r: r["trn"])
        else:
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
        self.register_outputs(
            {"bucket_name": self.bucket_name, "role_name": self.role_name, "role_trn": self.role_trn}
        )
