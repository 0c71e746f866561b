"""Tenants and their API keys: who may call, which models, with which caps and limits.

A key is `psk_<id>_<secret>`: the id (public, shown by `probserve keys list`) finds the key's
record, the secret (32 random bytes) makes it unguessable. The key file holds each key's
HMAC-SHA256 keyed with a server secret kept apart from it (another file, another Kubernetes
Secret), never the key: a copy of the key file alone authenticates nothing and tells nothing
of any key. A keyed hash rather than a slow one (bcrypt, argon2): the keys carry 256 random
bits, so there is no dictionary to slow down, and a slow hash would cost every request tens of
milliseconds. Hashes are compared in constant time.
"""

import base64
import hashlib
import hmac
import os
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, model_validator

from serve_app.config import Capabilities, Strict
from serve_app.errors import APIError

KEY_PREFIX = "psk"
ANONYMOUS = ""  # the tenant of every request when no key file is configured


class TenantLimits(Strict):
    """Per tenant; None: no limit. Requests and tokens per minute hold across every ingress
    replica (they are counted in the rate-limit storage); the in-flight bounds and their queues
    are per ingress replica."""

    requests_per_minute: int | None = Field(None, ge=1)
    # Prompt tokens computed plus tokens generated; a full-vocabulary position counts as
    # `full_vocab_token_weight` tokens (its JSON is tens of thousands of entries).
    tokens_per_minute: int | None = Field(None, ge=1)
    full_vocab_token_weight: int = Field(100, ge=1)
    max_in_flight: int | None = Field(None, ge=1)
    max_full_vocab_in_flight: int | None = Field(None, ge=1)
    # Beyond those bounds a tenant's requests wait in its own queue: at most this many, this
    # long, else 429.
    max_waiting: int = Field(16, ge=0)
    max_wait_s: float = Field(30, gt=0)
    # LoRA adapters loaded at run time (POST /v1/load_lora_adapter): how many the tenant holds
    # at once, and the folders it may load them from, each within the service's
    # `tenancy.adapter_roots` (None: all of those).
    max_adapters: int | None = Field(None, ge=0)
    adapter_roots: list[str] | None = None


class TenantCaps(Strict):
    """Caps tighter than a model's capabilities, for this tenant (the lower one applies)."""

    max_logprobs: int | None = Field(None, ge=0)
    max_logprob_token_ids: int | None = Field(None, ge=1)
    full_vocab_max_prompt_tokens: int | None = Field(None, ge=0)
    max_scored_tokens: int | None = Field(None, ge=1)


class Tenant(Strict):
    models: list[str] | Literal["*"] = "*"
    limits: TenantLimits = TenantLimits()
    caps: TenantCaps = TenantCaps()

    def allows(self, model: str) -> bool:
        return self.models == "*" or model in self.models

    def capabilities(self, model: Capabilities) -> Capabilities:
        tighter = {name: min(value, getattr(model, name))
                   for name, value in self.caps.model_dump().items() if value is not None}
        return model.model_copy(update=tighter)


UNLIMITED = Tenant()


class KeyRecord(Strict):
    id: str = Field(pattern=r"^[0-9a-f]{12}$")
    tenant: str
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")  # HMAC-SHA256(server secret, key), hex
    created: datetime
    revoked: bool = False


class KeyFile(Strict):
    tenants: dict[str, Tenant] = {}
    keys: list[KeyRecord] = []

    @model_validator(mode="after")
    def keys_name_known_tenants(self) -> "KeyFile":
        ids = [key.id for key in self.keys]
        if len(ids) != len(set(ids)):
            raise ValueError("key ids must be unique")
        unknown = sorted({key.tenant for key in self.keys} - set(self.tenants))
        if unknown:
            raise ValueError(f"keys name tenants the file does not define: {unknown}")
        return self

    @classmethod
    def read(cls, path: Path) -> "KeyFile":
        return cls.model_validate(yaml.safe_load(path.read_text()) or {})

    def write(self, path: Path) -> None:
        """Replaces the file at once (a reader never sees half of it); only its owner reads it."""
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        document = self.model_dump(mode="json", exclude_defaults=True)
        staged.write_text(yaml.safe_dump(document, sort_keys=False))
        staged.chmod(0o600)
        staged.replace(path)


def key_hash(server_secret: bytes, key: str) -> str:
    return hmac.new(server_secret, key.encode(), hashlib.sha256).hexdigest()


def new_key() -> tuple[str, str]:
    """(id, key)."""
    key_id = secrets.token_hex(6)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    return key_id, f"{KEY_PREFIX}_{key_id}_{secret}"


def create_key(keys: KeyFile, tenant: str, server_secret: bytes) -> tuple[KeyFile, str]:
    """The file with a new key for `tenant` (added, unlimited, when the file has no such
    tenant), and the key: shown once, never stored."""
    key_id, key = new_key()
    record = KeyRecord(id=key_id, tenant=tenant, hash=key_hash(server_secret, key),
                       created=datetime.now(UTC).replace(microsecond=0))
    tenants = keys.tenants if tenant in keys.tenants else {**keys.tenants, tenant: Tenant()}
    return KeyFile(tenants=tenants, keys=[*keys.keys, record]), key


def revoke_key(keys: KeyFile, key_id: str) -> KeyFile:
    if key_id not in {key.id for key in keys.keys}:
        raise KeyError(key_id)
    return keys.model_copy(update={"keys": [
        key.model_copy(update={"revoked": True}) if key.id == key_id else key for key in keys.keys]})


def missing_key() -> APIError:
    return APIError(401, "missing_api_key", "this service needs an API key: send the header "
                    "`Authorization: Bearer <key>`")


def invalid_key() -> APIError:
    return APIError(401, "invalid_api_key", "the API key is not valid (unknown or revoked)")


def bearer_key(authorization: str | None) -> str:
    scheme, _, key = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise missing_key()
    return key.strip()


class Keyring:
    """A key file as the ingress uses it: which tenant a key belongs to."""

    def __init__(self, keys: KeyFile, server_secret: bytes):
        self.tenants = keys.tenants
        self.server_secret = server_secret
        self.by_id = {key.id: key for key in keys.keys if not key.revoked}

    def tenant(self, authorization: str | None) -> str:
        """The tenant of an `Authorization: Bearer <key>` header, else 401."""
        key = bearer_key(authorization)
        prefix, _, rest = key.partition("_")
        key_id = rest.partition("_")[0]
        record = self.by_id.get(key_id) if prefix == KEY_PREFIX else None
        expected = record.hash if record else "0" * 64
        # Hashed and compared whether or not the id was found: the time does not say which.
        if not hmac.compare_digest(key_hash(self.server_secret, key), expected) or record is None:
            raise invalid_key()
        return record.tenant


class WatchedKeyring:
    """The key file's keyring, read again when the file changes (a Kubernetes Secret is
    updated in place), checked at most every `check_s` seconds. A file that fails to load
    keeps the previous keyring in use, and the error is reported."""

    def __init__(self, key_file: Path, secret_file: Path, check_s: float, report=print):
        self.key_file, self.secret_file, self.check_s, self.report = key_file, secret_file, check_s, report
        self.server_secret = read_secret(secret_file)
        self.seen = self.stamp()
        self.keyring = Keyring(KeyFile.read(key_file), self.server_secret)
        self.checked = time.monotonic()

    def stamp(self) -> tuple[int, int]:
        stat = self.key_file.stat()
        return stat.st_mtime_ns, stat.st_size

    def current(self) -> Keyring:
        if time.monotonic() - self.checked >= self.check_s:
            self.checked = time.monotonic()
            self.reload_if_changed()
        return self.keyring

    def reload_if_changed(self) -> None:
        try:
            stamp = self.stamp()
            if stamp != self.seen:
                self.keyring = Keyring(KeyFile.read(self.key_file), self.server_secret)
                self.seen = stamp
                self.report(f"key file {self.key_file} reloaded: {len(self.keyring.by_id)} active keys")
        except Exception as error:  # a half-written or invalid file: keep serving the last one
            self.report(f"key file {self.key_file} not reloaded, the previous keys stay in use: {error}")


def read_secret(path: Path) -> bytes:
    secret = path.read_bytes().strip()
    if len(secret) < 32:
        raise ValueError(f"{path}: the server secret must have at least 32 bytes")
    return secret


def new_secret() -> str:
    return secrets.token_urlsafe(48)
