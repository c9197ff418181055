"""Settings types for the names a stack chooses for its cloud resources.

Each is as long as the API's rule for every name derived from it allows: the rules, with
the page that states each, are in stacks/provider_contract.yaml, and
tests/test_provider_contract.py runs a stack built from the longest values accepted here
against them. The error says what is expected and why.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator


def _rule(pattern: str, expected: str) -> AfterValidator:
    rx = re.compile(pattern)

    def check(value: str) -> str:
        if not rx.fullmatch(value):
            raise ValueError(f"expected {expected}, got {value!r}")
        return value

    return AfterValidator(check)


# VKE cluster names take 2-64 characters, HPC cluster names must start with a letter, and
# the node pools are named <cluster>-<pool> (VKE node pools: 2-64 characters).
CLUSTER_NAME_MAX = 40
POOL_NAME_MAX = 64 - CLUSTER_NAME_MAX - 1
ClusterName = Annotated[str, _rule(
    rf"[a-z][-a-z0-9]{{0,{CLUSTER_NAME_MAX - 2}}}[a-z0-9]",
    f"2-{CLUSTER_NAME_MAX} lower-case letters, digits and -, starting with a letter and ending with a letter or "
    f"digit (the cluster's HPC clusters must start with a letter; its node pools, <cluster>-<pool>, fit VKE's 64 "
    "characters)")]
PoolName = Annotated[str, _rule(
    rf"[a-z0-9]([-a-z0-9]{{0,{POOL_NAME_MAX - 2}}}[a-z0-9])?",
    f"1-{POOL_NAME_MAX} lower-case letters, digits and -, starting and ending with a letter or digit (the node "
    f"pool <cluster>-<pool> fits VKE's 64 characters with a cluster name of up to {CLUSTER_NAME_MAX})")]
# CR instances: 3-30 characters, not starting with a digit or -, not ending with -.
REGISTRY_NAME_MAX = 30
RegistryName = Annotated[str, _rule(
    rf"[a-z][-a-z0-9]{{1,{REGISTRY_NAME_MAX - 2}}}[a-z0-9]",
    f"3-{REGISTRY_NAME_MAX} lower-case letters, digits and -, starting with a letter and ending with a letter or "
    "digit (CR instance names)")]
# CR namespaces: 2-90 characters, punctuation neither first, last nor doubled (kept to the
# 40 of the settings' other names).
CR_NAMESPACE_MAX = 40
CrNamespace = Annotated[str, _rule(
    rf"(?=.{{2,{CR_NAMESPACE_MAX}}}\Z)[a-z0-9]+(-[a-z0-9]+)*",
    f"2-{CR_NAMESPACE_MAX} lower-case letters and digits, with single - between them (CR namespaces refuse a "
    "name of one character and doubled punctuation)")]
# TOS buckets take 3-63 characters; the IAM role and user the stack derives from the bucket,
# <bucket>-reader, must fit IAM's 64.
BUCKET_NAME_MAX = 64 - len("-reader")
BucketName = Annotated[str, _rule(
    rf"[a-z0-9][-a-z0-9]{{1,{BUCKET_NAME_MAX - 2}}}[a-z0-9]",
    f"3-{BUCKET_NAME_MAX} lower-case letters, digits and -, starting and ending with a letter or digit (TOS "
    f"takes 63; the IAM role <bucket>-reader must fit IAM's 64)")]
