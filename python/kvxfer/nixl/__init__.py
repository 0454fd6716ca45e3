# SPDX-License-Identifier: Apache-2.0
"""NIXL's Python agent API (the package ``nixl``) over kvxfer, for host memory.

vLLM's NixlConnector and SGLang's NIXL backend import ``nixl``,
``nixl._api``, ``nixl._bindings`` and ``nixl._utils``; after
``kvxfer.nixl.install()`` those imports resolve to this package::

    import kvxfer.nixl
    kvxfer.nixl.install()          # before the connector is imported
    from nixl._api import nixl_agent, nixl_agent_config

Host memory ("DRAM") only; docs/nixl.md says what works and what differs.
"""

from __future__ import annotations

import sys

from . import _api, _bindings, _utils, logging
from ._api import (
    nixl_agent,
    nixl_agent_config,
    nixl_prepped_dlist_handle,
    nixl_xfer_handle,
)
from ._bindings import *  # noqa: F401,F403 - NIXL exposes its bindings' names at top level
from ._bindings import nixlXferTelemetry  # noqa: F401

_SUBMODULES = {"_api": _api, "_bindings": _bindings, "_utils": _utils, "logging": logging}


def install() -> None:
    """Makes ``import nixl`` (and nixl._api, nixl._bindings, nixl._utils,
    nixl.logging) give this package, through sys.modules. Call it before
    anything imports nixl. Idempotent. Raises RuntimeError when another
    ``nixl`` (the real NIXL) is imported already: the two cannot share a
    process's module table."""
    this = sys.modules[__name__]
    for name in ["nixl", *(f"nixl.{sub}" for sub in _SUBMODULES)]:
        present = sys.modules.get(name)
        if present is None or present is this or present in _SUBMODULES.values():
            continue
        raise RuntimeError(
            f"kvxfer.nixl.install(): module {name!r} is already imported from "
            f"{getattr(present, '__file__', None) or present!r}; install() must run before "
            "anything imports NIXL, and cannot replace a real NIXL already loaded"
        )
    sys.modules["nixl"] = this
    for sub, module in _SUBMODULES.items():
        sys.modules[f"nixl.{sub}"] = module


def installed() -> bool:
    """Whether ``import nixl`` gives this package."""
    return sys.modules.get("nixl") is sys.modules[__name__]


__all__ = [
    "install",
    "installed",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_prepped_dlist_handle",
    "nixl_xfer_handle",
    "nixlXferTelemetry",
]
