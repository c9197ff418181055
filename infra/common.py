"""Small helpers every infra component uses, so that each reads the same way."""

from __future__ import annotations

import pulumi


def child(parent: pulumi.Resource, **kwargs) -> pulumi.ResourceOptions:
    """Options for a child resource: parented to its component (which also passes the
    component's provider down to it)."""
    return pulumi.ResourceOptions(parent=parent, **kwargs)


def tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    """VolcEngine resources take tags as a list of {key, value} objects."""
    return [{"key": k, "value": v} for k, v in sorted(tags.items())]
