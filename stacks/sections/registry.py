"""`registry`: the CR Enterprise instance, the mirror of upstream artifacts, pull credentials."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stacks.names import CrNamespace, RegistryName
from stacks.sections.common import Model, Name


class RegistrySettings(Model):
    name: RegistryName | None = Field(None, description="CR Enterprise instance name; deepseek-<env> when unset")
    namespace: CrNamespace = Field("deepseek", description="CR namespace")
    repository: Name = Field("vllm-serving", description="repository of the serving image")
    mirror_namespace: CrNamespace = Field(
        "mirror",
        description="CR namespace holding copies of every upstream image and chart the stack deploys "
        "(`dsvolc images <stack>` lists them); nothing is pulled from outside the stack's registry",
    )
    mirror_lock: str = Field(
        "stacks/mirror.lock.yaml",
        pattern=r"^[A-Za-z0-9_./-]+\.ya?ml$",
        description="digests of the mirrored artifacts, recorded at mirror time (`dsvolc images <stack> --record`); "
        "relative to the repository root",
    )
    pull_credentials: Literal["cr-credential-controller", "image-pull-secret"] = Field(
        "cr-credential-controller",
        description="how nodes authenticate pulls from the private repository: VKE's cr-credential-controller "
        "add-on, or a kubernetes.io/dockerconfigjson Secret named by image_pull_secret in the pods' imagePullSecrets",
    )
    image_pull_secret: Name | None = Field(
        None,
        description="pull Secret in the serving namespace (created outside the stack) when pull_credentials is "
        "image-pull-secret",
    )

    @model_validator(mode="after")
    def _secret(self):
        if self.pull_credentials == "image-pull-secret" and not self.image_pull_secret:
            raise ValueError("image_pull_secret: required when pull_credentials is 'image-pull-secret'")
        if self.pull_credentials != "image-pull-secret" and self.image_pull_secret:
            raise ValueError("image_pull_secret: only used when pull_credentials is 'image-pull-secret'; remove it "
                             "or switch pull_credentials")
        return self
