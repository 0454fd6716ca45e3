# SPDX-License-Identifier: Apache-2.0
"""Engine settings reach Python as C++ judges them: a KVXFER_* name kvxfer
does not know, in engine_config or in the environment, refuses the
Transport (RuntimeError) naming it and the nearest known one; engine_config
wins over the environment (docs/configuration.md)."""

import re

import numpy as np
import pytest

import kvxfer


def make(**options):
    return kvxfer.Transport("settings", np.zeros((4, 64), np.uint8), **options)


def test_misspelt_key_in_engine_config_is_refused_by_name():
    message = "engine_config KVXFER_LANE is not a kvxfer setting; did you mean KVXFER_LANES?"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        make(engine_config={"KVXFER_LANE": "tcp"})


def test_misspelt_variable_in_the_environment_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("KVXFER_LANE", "tcp")
    message = "environment KVXFER_LANE is not a kvxfer setting; did you mean KVXFER_LANES?"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        make(engine_config={"KVXFER_LANES": "tcp"})


def test_engine_config_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("KVXFER_LANES", "nope")
    t = make(engine_config={"KVXFER_LANES": "tcp"})
    t.close()
    with pytest.raises(RuntimeError, match=re.escape("environment KVXFER_LANES=nope")):
        make()
