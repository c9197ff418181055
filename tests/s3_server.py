"""A real S3 server process on localhost for the weights tool's tests and benchmark.

`moto[server]` (PyPI) serves the S3 REST API over HTTP: listing, ranged and conditional
GETs, HEAD with partNumber, multipart uploads with S3's multipart ETags. The weights
tool speaks the same protocol to TOS's S3-compatible endpoint. Buckets live in the server
process's memory; the server is started as a subprocess and stopped by the caller.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ports import free_port as _free_port

REGION = "cn-beijing"
ACCESS_KEY = "test-reader"
SECRET_KEY = "test-secret"




class S3Server:
    def __init__(self, log_dir: Path):
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(log_dir) / "s3-server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"S3 server did not start; see {self.log.name}")
                time.sleep(0.2)

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY,
                            config=Config(s3={"addressing_style": "path"}, max_pool_connections=16))

    def create_bucket(self, name: str):
        c = self.client()
        c.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
        return c

    def env(self) -> dict[str, str]:
        """What the weights tool needs to authenticate (the static-key path)."""
        return {"TOS_ACCESS_KEY": ACCESS_KEY, "TOS_SECRET_KEY": SECRET_KEY}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        self.log.close()


def upload_multipart(client, bucket: str, key: str, data: bytes, part_size: int) -> str:
    """Upload as S3 multipart (ETag `<md5 of part md5s>-<parts>`); returns the ETag."""
    up = client.create_multipart_upload(Bucket=bucket, Key=key)
    parts = []
    for i, start in enumerate(range(0, len(data), part_size), start=1):
        r = client.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=i,
                               Body=data[start:start + part_size])
        parts.append({"ETag": r["ETag"], "PartNumber": i})
    done = client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"],
                                            MultipartUpload={"Parts": parts})
    return done["ETag"].strip('"')


class CuttingProxy:
    """A TCP proxy in front of the S3 server that breaks one download mid-stream: after
    `cut_after` bytes have gone from the server to the client, it resets that connection
    (a network fault between a node and TOS). Later connections pass untouched."""

    def __init__(self, upstream_port: int, cut_after: int):
        import socket
        import threading

        self.cut_after, self.sent, self.cuts = cut_after, 0, 0
        self._lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.upstream_port = upstream_port
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src, dst, downstream: bool) -> None:
        import socket
        import struct

        try:
            while chunk := src.recv(65536):
                if downstream:
                    with self._lock:
                        cut = self.cuts == 0 and self.sent + len(chunk) > self.cut_after
                        if cut:
                            self.cuts += 1
                            chunk = chunk[: self.cut_after - self.sent]
                        self.sent += len(chunk)
                    if cut:
                        dst.sendall(chunk)
                        # The client sees the connection end mid-body; shutdown also wakes the
                        # other direction's thread blocked reading this socket.
                        dst.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        for s in (dst, src):
                            s.shutdown(socket.SHUT_RDWR)
                        return
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self.server.close()
