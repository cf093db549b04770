"""Run one role's server in this process (``tessera serve --role R``): a table from role to its
module, each with its own ``Settings`` (a frozen dataclass; every field is a flag and a
``TESSERA_SERVE_<NAME>`` variable) and its own ``main``."""

from __future__ import annotations

import argparse
import importlib
import logging
from dataclasses import fields

from services.engine.config import EngineConfig
from services.models.registry import resolve_model
from services.preprocess.config import PreprocessConfig
from shared import allocator
from shared.colocation import cpu_budget
from shared.index.cluster_config import EXIT_REFUSED, ConfigMismatchError
from shared.settings import dataclass_from_sources
from shared.tracing import configure_tracing

ENV_PREFIX = "TESSERA_SERVE_"
ROLE_TO_MODULE = {
    "preprocess": "services.preprocess.main",
    "encoder": "services.encoder.main",
    "prefill": "services.prefill.main",
    "decode": "services.decode.main",
    "gateway": "services.gateway.server",
}
# Where each role's Settings live: its main module, except the gateway's, whose server module
# imports the HTTP stack.
ROLE_TO_SETTINGS = {**ROLE_TO_MODULE, "gateway": "services.gateway.settings"}
ROLES = tuple(ROLE_TO_MODULE)
ROLES_WITH_INBOX = frozenset({"encoder", "prefill", "decode"})  # they bind a data address for tensors
EXIT_UNREACHABLE = EXIT_REFUSED  # a node its peers could not dial: a configuration error, like a refusal
TENSOR_FREE_ROLES = frozenset({"gateway"})  # they run no model and load no torch (tests/test_layering.py)
log = logging.getLogger("tessera")


def settings_class(role: str) -> type:
    return importlib.import_module(ROLE_TO_SETTINGS[role]).Settings


def setting_names() -> list[str]:
    """Every role setting's name, once (the union of the roles' Settings fields)."""
    names: dict[str, None] = {}
    for role in ROLES:
        names.update(dict.fromkeys(f.name for f in fields(settings_class(role))))
    return list(names)


def role_settings(role: str, flags: argparse.Namespace):
    """``role``'s Settings from flags, then TESSERA_SERVE_* variables, then defaults. A flag given
    that this role has no setting for is reported and ignored (the local launcher passes the
    same flags to every role)."""
    cls = settings_class(role)
    own = {f.name for f in fields(cls)}
    for name in setting_names():
        if name not in own and getattr(flags, name, None) is not None:
            log.warning("--%s does not apply to the %s role; ignored", name.replace("_", "-"), role)
    return dataclass_from_sources(cls, ENV_PREFIX, flags)


def _check_advertised_addresses(role: str, settings) -> None:
    """A node its peers could not dial stops here, before its model loads, with the reason."""
    from services.transport.addresses import AdvertiseError
    from services.transport.node_runtime import NodeSettings, node_addresses

    if isinstance(settings, NodeSettings):
        try:
            node_addresses(settings, with_inbox=role in ROLES_WITH_INBOX)
        except AdvertiseError as exc:
            log.error("the %s node cannot start: %s", role, exc)
            raise SystemExit(EXIT_UNREACHABLE) from None


def run_role(role: str, settings, engine_config: EngineConfig, preprocess_config: PreprocessConfig) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role} %(levelname)s %(message)s")
    configure_tracing(role)
    share = cpu_budget.share_for_this_node(role)
    keeps_freed_memory = False
    if role not in TENSOR_FREE_ROLES:
        cpu_budget.apply_torch_threads(share)
        keeps_freed_memory = allocator.keep_freed_memory()
    log.info(
        "CPU share: %d threads, OMP_WAIT_POLICY=%s, cores %s; freed memory kept: %s",
        share.num_threads,
        share.wait_policy,
        share.cpus or "any",
        keeps_freed_memory,
    )
    _check_advertised_addresses(role, settings)
    model = resolve_model(settings.model)
    try:
        importlib.import_module(ROLE_TO_MODULE[role]).main(settings, model, engine_config, preprocess_config)
    except ConfigMismatchError as exc:
        log.error("%s", exc)
        raise SystemExit(EXIT_REFUSED) from None
