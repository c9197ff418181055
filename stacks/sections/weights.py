"""`weights`: the TOS bucket model weights are kept in."""

from __future__ import annotations

from pydantic import Field, model_validator

from stacks.names import BucketName
from stacks.sections.common import _C, Model, SseAlgorithm


class WeightsSettings(Model):
    bucket_name: BucketName | None = Field(
        None,
        description="TOS bucket for model weights; deepseek-volc-<env>-weights when unset",
    )
    prefix: str = Field(
        "models", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*[A-Za-z0-9]$", description="key prefix the serving pods may read"
    )
    noncurrent_version_days: int = Field(30, ge=1, le=3650, description="days before old object versions expire")
    sse_algorithm: SseAlgorithm = Field("AES256", description="server-side encryption algorithm")
    kms_key_id: str | None = Field(
        None, description="KMS key when sse_algorithm is kms: trn:kms:<region>:<accountID>:keyrings/<keyring>/keys/<key>"
    )

    @model_validator(mode="after")
    def _kms(self):
        if self.sse_algorithm == "kms" and not self.kms_key_id:
            raise ValueError("kms_key_id: required when sse_algorithm is 'kms'")
        if self.kms_key_id is not None:
            problems = _C.problems("volcengine:tos/bucketEncryption:BucketEncryption",
                                   "rule.applyServerSideEncryptionByDefault.kmsMasterKeyId", self.kms_key_id)
            if problems:
                raise ValueError(f"kms_key_id: {problems[0]}; expected trn:kms:<region>:<accountID>:keyrings/"
                                 "<keyring>/keys/<key>")
        return self
