"""Where the weights come from, for `python -m runtime.weights`: a directory laid out like
the bucket prefix, or the bucket itself through the S3 API (TOS's S3-compatible endpoint),
with the credentials for it (IRSA through the TOS SDK's OIDC provider, else the reader's
static key), also written as shell exports for other S3 clients (runai_streamer).

Imports only the standard library; boto3, botocore and the TOS SDK are imported lazily
(runtime/__init__.py says why).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator, Protocol

CHUNK = 8 * 1024 * 1024  # bytes per read when hashing a file on disk
NET_CHUNK = 1024 * 1024  # bytes per read from the network (what a broken connection may lose)
DEFAULT_CONNECTIONS = 8


class WeightsError(Exception):
    """A problem the operator must fix; printed without a traceback."""


class ChangedRemotely(Exception):
    """The object changed between listing and reading (If-Match failed)."""


# --------------------------------------------------------------------------- stores


@dataclass(frozen=True)
class RemoteObject:
    key: str  # relative to the model prefix
    size: int
    etag: str  # without quotes


class Store(Protocol):
    def describe(self, key: str = "") -> str: ...
    def list(self) -> list[RemoteObject]: ...
    def read(self, obj: RemoteObject, offset: int) -> Iterator[bytes]: ...
    def part_size(self, obj: RemoteObject) -> int | None: ...


class DirStore:
    """A directory laid out like the bucket prefix (a mounted volume)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def describe(self, key: str = "") -> str:
        return str(self.root / key) if key else str(self.root)

    def list(self) -> list[RemoteObject]:
        if not self.root.is_dir():
            raise WeightsError(f"source {self.root} does not exist")
        out = []
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                st = p.stat()
                out.append(RemoteObject(str(p.relative_to(self.root)), st.st_size, f"{st.st_size}-{int(st.st_mtime_ns)}"))
        return out

    def read(self, obj: RemoteObject, offset: int) -> Iterator[bytes]:
        path = self.root / obj.key
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            raise WeightsError(f"{path}: listed but not found when read") from None
        with fh:
            fh.seek(offset)
            while chunk := fh.read(CHUNK):
                yield chunk

    def part_size(self, obj: RemoteObject) -> int | None:
        return None


def _client_error_code(exc) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


class S3Store:
    """A bucket prefix through the S3 API (TOS's S3-compatible endpoint in production)."""

    def __init__(self, bucket: str, prefix: str, endpoint: str, region: str, *,
                 connections: int = DEFAULT_CONNECTIONS, addressing_style: str = "virtual"):
        import boto3
        import botocore.session
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/"
        self.endpoint = endpoint
        config = Config(
            region_name=region,
            max_pool_connections=connections,
            connect_timeout=10,
            read_timeout=120,
            retries={"max_attempts": 8, "mode": "standard"},
            s3={"addressing_style": addressing_style},
            # Only what the S3 API itself requires: newer botocore otherwise asks for
            # CRC checksums that S3-compatible stores do not all return.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        core = botocore.session.get_session()
        # Ours first in botocore's provider chain; without IRSA or a static key it finds
        # nothing and boto3's own chain (AWS_* variables) applies.
        core.get_component("credential_provider").insert_before("env", _credential_provider())
        self.client = boto3.session.Session(botocore_session=core).client("s3", endpoint_url=endpoint, config=config)

    def describe(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}{key} (endpoint {self.endpoint})"

    def list(self) -> list[RemoteObject]:
        from botocore.exceptions import BotoCoreError, ClientError

        out: list[RemoteObject] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    if obj["Key"].endswith("/"):
                        continue
                    out.append(RemoteObject(obj["Key"][len(self.prefix):], int(obj["Size"]), obj["ETag"].strip('"')))
        except ClientError as exc:
            code = _client_error_code(exc)
            if code == "NoSuchBucket":
                raise WeightsError(f"bucket {self.bucket!r} does not exist at {self.endpoint}") from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
                raise WeightsError(f"listing {self.describe()} was refused ({code}): check the reader role "
                                   "or key and its policy on this prefix") from None
            raise WeightsError(f"listing {self.describe()} failed: {exc}") from None
        except BotoCoreError as exc:
            raise WeightsError(f"cannot reach {self.endpoint}: {exc}") from None
        return out

    def read(self, obj: RemoteObject, offset: int) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        args = {"Bucket": self.bucket, "Key": self.prefix + obj.key, "IfMatch": f'"{obj.etag}"'}
        if offset:
            args["Range"] = f"bytes={offset}-"
        try:
            resp = self.client.get_object(**args)
        except ClientError as exc:
            code = _client_error_code(exc)
            if code in ("NoSuchKey", "404"):
                raise WeightsError(f"{self.describe(obj.key)}: object not found (listed, then gone: "
                                   "was the checkpoint re-uploaded during the sync?)") from None
            if code in ("PreconditionFailed", "412"):
                raise ChangedRemotely(obj.key) from None
            raise WeightsError(f"{self.describe(obj.key)}: {exc}") from None
        body = resp["Body"]
        try:
            yield from body.iter_chunks(NET_CHUNK)
        finally:
            body.close()

    def part_size(self, obj: RemoteObject) -> int | None:
        """Size of the first part of a multipart object, when the server reports it."""
        from botocore.exceptions import ClientError

        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=self.prefix + obj.key, PartNumber=1)
        except ClientError:
            return None
        n = int(resp.get("ContentLength", 0))
        return n if 0 < n < obj.size else None


def _credential_provider():
    """A botocore credential provider for the chain (botocore is imported lazily)."""
    from botocore.credentials import CredentialProvider

    class TosCredentialProvider(CredentialProvider):
        METHOD = "volcengine-tos"
        CANONICAL_NAME = "VolcengineTos"

        def load(self):
            return _botocore_credentials()

    return TosCredentialProvider()


def _botocore_credentials():
    """IRSA: refreshable credentials from STS AssumeRoleWithOIDC (the TOS SDK's provider);
    else the static reader key; None leaves boto3's own chain (AWS_* variables)."""
    from botocore.credentials import Credentials, RefreshableCredentials

    if os.environ.get("VOLCENGINE_OIDC_TOKEN_FILE"):
        provider = _oidc_provider()

        def fetch() -> dict:
            c = provider.get_credentials()
            # The provider caches and renews itself (5 min before expiry); asking it again
            # every 5 minutes keeps boto3 on fresh keys without tracking STS's expiry here.
            expiry = datetime.now(timezone.utc) + timedelta(minutes=20)
            return {"access_key": c.access_key_id, "secret_key": c.access_key_secret,
                    "token": c.security_token, "expiry_time": expiry.isoformat()}

        return RefreshableCredentials.create_from_metadata(fetch(), fetch, "volcengine-oidc")
    ak, sk = os.environ.get("TOS_ACCESS_KEY"), os.environ.get("TOS_SECRET_KEY")
    if ak and sk:
        return Credentials(ak, sk)
    return None


def _oidc_provider():
    try:
        import tos  # type: ignore[import-not-found]
    except ImportError:
        raise WeightsError("IRSA is configured (VOLCENGINE_OIDC_TOKEN_FILE) but the TOS SDK is not installed") from None
    try:
        return tos.OIDCCredentialsProvider()
    except Exception as exc:  # noqa: BLE001 - the SDK raises its own client error type
        raise WeightsError(f"IRSA credentials: {exc}") from None


# --------------------------------------------------------------------------- credentials


def write_s3_credentials(out: Path, s3_endpoint: str, region: str) -> None:
    """Exchange the projected OIDC token (IRSA) for temporary credentials and write them as
    shell exports for S3 clients. Without IRSA the static key in the environment is used."""
    if os.environ.get("VOLCENGINE_OIDC_TOKEN_FILE"):
        try:
            creds = _oidc_provider().get_credentials()
        except WeightsError:
            raise
        except Exception as exc:  # noqa: BLE001 - the SDK raises its own client error type
            raise WeightsError(f"STS AssumeRoleWithOIDC failed: {exc}") from None
        ak, sk, token = creds.access_key_id, creds.access_key_secret, creds.security_token
    else:
        ak, sk, token = os.environ.get("TOS_ACCESS_KEY"), os.environ.get("TOS_SECRET_KEY"), None
        if not ak or not sk:
            raise WeightsError("no credentials: neither VOLCENGINE_OIDC_TOKEN_FILE (IRSA) nor TOS_ACCESS_KEY is set")
    lines = {
        "AWS_ACCESS_KEY_ID": ak,
        "AWS_SECRET_ACCESS_KEY": sk,
        "AWS_ENDPOINT_URL": s3_endpoint,
        "RUNAI_STREAMER_S3_ENDPOINT": s3_endpoint,
        "AWS_DEFAULT_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    if token:
        lines["AWS_SESSION_TOKEN"] = token
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        for k, v in lines.items():
            fh.write(f"export {k}={_shell_quote(v)}\n")


def _shell_quote(v: str) -> str:
    return "'" + str(v).replace("'", "'\"'\"'") + "'"
