# SPDX-License-Identifier: Apache-2.0
"""NIXL's ``nixl.logging``: kvxfer.nixl logs to logging.getLogger("kvxfer.nixl")."""

from __future__ import annotations

import logging as _logging


def get_logger(name: str) -> _logging.Logger:
    return _logging.getLogger(name)
