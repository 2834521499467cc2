"""The artifact store: datasets, adapters and checkpoints by key, in a local directory or S3."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.errors import ArtifactStoreError, ConfigError, NotFound

if TYPE_CHECKING:
    from reef.settings import Settings

MANIFEST = ".manifest.json"


def tree_hash(path: Path) -> str:
    """sha256 over a directory's files (relative paths and contents): equal trees, equal hash."""
    h = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name != MANIFEST):
        h.update(file.relative_to(path).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(file.read_bytes()).digest())
    return h.hexdigest()


class ArtifactStore(ABC):
    """Immutable-ish blobs under '/'-separated keys ("datasets/<scenario>/<kind>/<hash>.parquet")."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> str:
        """Write `data` under `key` (whole or not at all); returns its uri."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The bytes under `key`; NotFound when there are none."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def uri(self, key: str) -> str:
        """Where `key` lives, as a file:// or s3:// uri."""

    @abstractmethod
    def list_keys(self, prefix: str) -> list[str]:
        """Keys under `prefix` + "/", sorted."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under `prefix` + "/" (a deleted scenario's datasets, say); returns
        how many went. Idempotent: nothing there, nothing to do. Keys beside the prefix that
        merely start with it ("datasets/a2/..." for "datasets/a") are left alone."""

    @abstractmethod
    def ping(self) -> None:
        """Raise ArtifactStoreError unless the store can be written now (readiness: no side
        effects)."""

    # trees: a release's files (an adapter or a checkpoint directory) under one prefix -------
    def put_tree(self, prefix: str, path: Path) -> str:
        """Copy the files under directory `path` to keys `prefix/<relative path>`. The manifest
        (`prefix/.manifest.json`, the file list with sha256s) goes last: a tree without one is
        incomplete and never read. Returns the tree's uri."""
        manifest = {}
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            rel = file.relative_to(path).as_posix()
            data = file.read_bytes()
            manifest[rel] = hashlib.sha256(data).hexdigest()
            self.put_bytes(f"{prefix}/{rel}", data)
        self.put_bytes(f"{prefix}/{MANIFEST}", json.dumps(manifest, sort_keys=True).encode())
        return self.uri(prefix)

    def fetch_tree(self, prefix: str, dest: Path) -> Path:
        """The tree under `prefix` as a local directory `dest` (checked against its manifest;
        reused when already complete)."""
        manifest = json.loads(self.get_bytes(f"{prefix}/{MANIFEST}"))
        done = dest / MANIFEST
        if done.is_file() and json.loads(done.read_text()) == manifest:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
        try:
            for rel, digest in manifest.items():
                data = self.get_bytes(f"{prefix}/{rel}")
                if hashlib.sha256(data).hexdigest() != digest:
                    raise ArtifactStoreError(
                        f"artifact {self.uri(prefix)}/{rel} does not match its manifest"
                    )
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
            if dest.exists():  # an incomplete or different copy
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid artifact key '{key}'")
    return key


class LocalArtifacts(ArtifactStore):
    """A directory. Writes go to a temporary file renamed into place, so a reader never sees
    half a file and a crash leaves no partial artifact behind."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()

    def __repr__(self) -> str:
        return f"LocalArtifacts({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put_bytes(self, key: str, data: bytes) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.uri(key)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"artifact '{key}' not found in {self.root}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def uri(self, key: str) -> str:
        return self._path(key).as_uri() if key else self.root.as_uri()

    def ping(self) -> None:
        # The directory is made on the first write: then its nearest existing parent counts.
        place = self.root
        while not place.exists() and place != place.parent:
            place = place.parent
        if not place.is_dir() or not os.access(place, os.W_OK | os.X_OK):
            raise ArtifactStoreError(f"artifact directory {self.root} is not writable")

    def fetch_tree(self, prefix: str, dest: Path) -> Path:
        """Already local: the tree's own directory, once its manifest says it is complete."""
        if not self.exists(f"{prefix}/{MANIFEST}"):
            raise NotFound(f"artifact tree '{prefix}' not found (or incomplete) in {self.root}")
        return self._path(prefix)

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(
            f"{prefix}/{p.relative_to(base).as_posix()}"
            for p in base.rglob("*")
            if p.is_file() and not p.name.endswith(".tmp")
        )

    def delete_prefix(self, prefix: str) -> int:
        base = self._path(prefix)
        if not base.is_dir():
            return 0
        n = len(self.list_keys(prefix))
        # Renamed aside first, then removed: a reader never sees half a tree under the prefix,
        # and a crash mid-way leaves a hidden directory no key maps to (removed on a rerun).
        doomed = base.with_name(f".{base.name}.deleting")
        try:
            if doomed.exists():
                shutil.rmtree(doomed)
            os.replace(base, doomed)
            shutil.rmtree(doomed)
        except OSError as e:
            raise ArtifactStoreError(f"deleting {self.uri(prefix)} failed: {e}") from None
        return n


@dataclass(frozen=True)
class S3Limits:
    """How long an S3 call may wait and how often it is tried (artifacts.s3_*): boto3's own
    defaults wait 60 s per connection and per read."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_attempts: int = 3

    def config(self) -> Any:
        from botocore.config import Config

        return Config(
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            retries={"max_attempts": self.max_attempts, "mode": "standard"},
        )


class S3Artifacts(ArtifactStore):
    """A bucket (and key prefix) on S3 or an S3-compatible server (MinIO, moto). Credentials
    come from boto3's usual chain: environment, shared config/credentials files, instance role."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
        limits: S3Limits = S3Limits(),
    ):
        import boto3  # imported here: only S3 users pay for it

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=limits.config()
        )

    def __repr__(self) -> str:
        return f"S3Artifacts({self.uri('')!r})"

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_bytes(self, key: str, data: bytes) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        try:  # a single PUT is atomic on S3: the object appears whole or not at all
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except (BotoCoreError, ClientError) as e:
            raise ArtifactStoreError(f"writing {self.uri(key)} failed: {e}") from None
        return self.uri(key)

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return bytes(obj["Body"].read())
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise NotFound(f"artifact '{self.uri(key)}' not found") from None
            raise ArtifactStoreError(f"reading {self.uri(key)} failed: {e}") from None
        except BotoCoreError as e:
            raise ArtifactStoreError(f"reading {self.uri(key)} failed: {e}") from None

    def list_keys(self, prefix: str) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        start = self._key(prefix) + "/"
        keys: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=start
            ):
                for obj in page.get("Contents", []):
                    keys.append(f"{prefix}/{obj['Key'][len(start) :]}")
        except (BotoCoreError, ClientError) as e:
            raise ArtifactStoreError(f"listing {self.uri(prefix)} failed: {e}") from None
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> int:
        from botocore.exceptions import BotoCoreError, ClientError

        start = self._key(prefix) + "/"
        n = 0
        try:
            # A page of a listing is at most 1,000 keys: what one DeleteObjects takes.
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=start
            ):
                objects = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
                if not objects:
                    continue
                answer = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
                )
                if answer.get("Errors"):
                    first = answer["Errors"][0]
                    raise ArtifactStoreError(
                        f"deleting {self.uri(prefix)} failed: {len(answer['Errors'])} keys "
                        f"were not deleted ({first.get('Key')}: {first.get('Message')})"
                    )
                n += len(objects)
        except (BotoCoreError, ClientError) as e:
            raise ArtifactStoreError(f"deleting {self.uri(prefix)} failed: {e}") from None
        return n

    def ping(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as e:
            raise ArtifactStoreError(f"bucket {self.bucket} is unreachable: {e}") from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise ArtifactStoreError(f"looking up {self.uri(key)} failed: {e}") from None
        except BotoCoreError as e:
            raise ArtifactStoreError(f"looking up {self.uri(key)} failed: {e}") from None

    def uri(self, key: str) -> str:
        path = self._key(key) if key else self.prefix
        return f"s3://{self.bucket}/{path}"


def open_artifacts(
    url: str | Path,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    limits: S3Limits = S3Limits(),
) -> ArtifactStore:
    """ "s3://bucket/prefix" opens S3Artifacts; a path (or file:// uri) opens LocalArtifacts."""
    text = str(url)
    if text.startswith("s3://"):
        bucket, _, prefix = text.removeprefix("s3://").partition("/")
        if not bucket:
            raise ConfigError(f"artifact url '{text}' names no bucket (s3://bucket/prefix)")
        return S3Artifacts(bucket, prefix, endpoint_url=endpoint_url, region=region, limits=limits)
    if "://" in text and not text.startswith("file://"):
        raise ConfigError(f"artifact url '{text}': use a directory path or s3://bucket/prefix")
    return LocalArtifacts(text.removeprefix("file://"))


def artifacts_for(settings: Settings) -> ArtifactStore:
    """The configured artifact store (`artifacts.url`, its S3 endpoint, region and limits)."""
    cfg = settings.artifacts
    return open_artifacts(
        settings.artifacts_url,
        endpoint_url=cfg.s3_endpoint_url,
        region=cfg.s3_region,
        limits=S3Limits(cfg.s3_connect_timeout_s, cfg.s3_read_timeout_s, cfg.s3_max_attempts),
    )
