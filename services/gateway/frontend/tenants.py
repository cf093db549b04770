"""API keys, the tenants they belong to, and what a tenant changes about a request's caching.

Keys: ``--api-key KEY`` (one tenant, "default"), or ``--api-keys-file FILE``, a JSON object
mapping each key to a tenant name, or to ``{"tenant": NAME, "shared_cache": true}``. Keys are
kept as SHA-256 digests and looked up by digest, so a lookup's time does not depend on how much
of a key matched. With no keys configured there are no tenants and nothing is checked.

Isolation (with keys): the server derives each request's ``cache_salt``, so one tenant's cached
prompt prefixes are never another's:
  private tenant   "tenant:<name>|<client salt>"   (the client's salt only subdivides the tenant)
  shared tenant    "shared|<client salt>", or no salt when the client sends none: the common
                   namespace, where tenants that opted in share e.g. a system prompt's blocks
The prefixes make every derived salt distinct from every other (no client salt can reach into a
private namespace). Media ``uuid``s, which stand for the bytes first sent with them
(services/preprocess/media_uuids.py), are prefixed with "<tenant>/" for every tenant, so their
bindings are per tenant and no tenant can claim another's id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    shared_cache: bool = False

    def cache_salt(self, client_salt: str | None) -> str | None:
        if self.shared_cache:
            return f"shared|{client_salt}" if client_salt else None
        return f"tenant:{self.name}|{client_salt or ''}"

    def image_uuid(self, uuid: str) -> str:
        return f"{self.name}/{uuid}"


def request_cache_salt(tenant: Tenant | None, client_salt: str | None) -> str | None:
    """The salt a request's cached work is keyed under: the tenant's scoping of the client's."""
    return tenant.cache_salt(client_salt) if tenant is not None else client_salt


class ApiKeys:
    def __init__(self, key_to_tenant: dict[str, Tenant]) -> None:
        if not key_to_tenant:
            raise ValueError("no API keys given")
        self._digest_to_tenant = {_digest(key): tenant for key, tenant in key_to_tenant.items()}

    def tenant_for(self, key: str) -> Tenant | None:
        return self._digest_to_tenant.get(_digest(key))

    @staticmethod
    def from_settings(api_key: str, api_keys_file: str) -> ApiKeys | None:
        """None when neither is set: authentication is off."""
        key_to_tenant: dict[str, Tenant] = {}
        if api_key:
            key_to_tenant[api_key] = Tenant("default")
        if api_keys_file:
            key_to_tenant.update(parse_keys_file(Path(api_keys_file)))
        return ApiKeys(key_to_tenant) if key_to_tenant else None


def parse_keys_file(path: Path) -> dict[str, Tenant]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the API keys file {path}: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a JSON object mapping API keys to tenants")
    out = {}
    for key, entry in raw.items():
        if isinstance(entry, str):
            entry = {"tenant": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("tenant"), str) or not entry["tenant"]:
            raise ValueError(f'{path}: each key maps to a tenant name or {{"tenant": NAME, "shared_cache": BOOL}}')
        if not key or "/" in entry["tenant"]:
            raise ValueError(f"{path}: keys must be non-empty and tenant names may not contain '/'")
        out[key] = Tenant(entry["tenant"], bool(entry.get("shared_cache", False)))
    return out


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
