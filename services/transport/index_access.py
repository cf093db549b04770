"""Opening the cluster index the way every process of the cluster must: with the index's
credentials (an ACL user and password, TLS) and with node records sealed under the internal
secret. The gateway and every node role open it here, so the rule is written once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from services.transport.internal_auth import InternalAuth, InternalPlaneSettings
from shared.index.backend import CacheIndex, IndexCredentials, create_index
from shared.index.reader import IndexReader, create_reader
from shared.index.uuid_bindings import UuidBindings, create_bindings

PASSWORD_ENV = "TESSERA_INDEX_PASSWORD"


def index_credentials(settings: InternalPlaneSettings, env: Mapping[str, str] = os.environ) -> IndexCredentials:
    """The password from ``index_password_file``, else from TESSERA_INDEX_PASSWORD, else none."""
    if settings.index_password_file is not None:
        password: str | None = settings.index_password_file.read_text().strip()
        if not password:
            raise ValueError(f"the index password file {settings.index_password_file} is empty")
    else:
        password = env.get(PASSWORD_ENV, "").strip() or None
    return IndexCredentials(username=settings.index_username or None, password=password, tls_ca=settings.index_tls_ca)


def open_index(url: str, *, namespace: str, settings: InternalPlaneSettings, env: Mapping[str, str] = os.environ) -> CacheIndex:
    """A node's index: it registers, heartbeats, publishes and looks up, from its own threads."""
    return create_index(url, namespace=namespace, **_access(url, settings, env))


def open_reader(url: str, *, namespace: str, settings: InternalPlaneSettings, env: Mapping[str, str] = os.environ) -> IndexReader:
    """The gateway's index: read on its event loop (shared/index/reader.py)."""
    return create_reader(url, namespace=namespace, **_access(url, settings, env))


def open_bindings(
    url: str, *, namespace: str, settings: InternalPlaneSettings, ttl_s: float, max_entries: int, env: Mapping[str, str] = os.environ
) -> UuidBindings:
    """Client media uuid bindings, on the index's server (shared/index/uuid_bindings.py)."""
    access = _access(url, settings, env)
    return create_bindings(url, namespace=namespace, credentials=access["credentials"], ttl_s=ttl_s, max_entries=max_entries)


def _access(url: str, settings: InternalPlaneSettings, env: Mapping[str, str]) -> dict:
    """The credentials and the record key every opening takes, once the URL is known to carry no
    password."""
    if urlsplit(url).password:
        raise ValueError(
            f"the index URL carries a password: give it in a file (--index-password-file) or {PASSWORD_ENV}, "
            "never on a command line or in a URL"
        )
    auth = InternalAuth.from_settings(settings, env)
    return {
        "credentials": index_credentials(settings, env),
        "record_key": auth.record_key,
        "record_max_skew_s": settings.index_record_max_skew_s,
    }
