# SPDX-License-Identifier: Apache-2.0
"""config_fingerprint is byte-identical to the reference's:
sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"))) [:16]."""

import hashlib
import json

import numpy as np
import pytest

import kvxfer
from conftest import connect

FIELDS = [
    {"model": "meta-llama/Llama-3.1-8B"},
    {"model": "m", "dtype": "bfloat16", "block_size": "16", "layout": "NHD", "tp": "2"},
    {"zeta": "1", "Alpha": "2", "alpha": "3", "_": "4", "10": "5", "9": "6"},
    {"modèle": "Llama-3 — instruct", "キー": "値", "ключ": "значение"},
    {"emoji": "🚀 rocket", "math": "𝔸𝔹ℂ", "mixed": "a\u00e9\u4e2d\U0001f600"},
    {"quote": 'say "hi"', "backslash": "C:\\path\\to", "slash": "a/b"},
    {"controls": "tab\tnewline\ncr\rbell\x07nul\x00del\x7f", "ff": "\f\b"},
    {"": "", " ": " "},
    # Any JSON-serialisable values, as the reference takes them.
    {"block_size": 16},
    {"model": "llama", "block_size": 16, "dtype": "bfloat16", "tp": 2, "use_mla": False},
    {"none": None, "true": True, "false": False, "zero": 0, "neg": -7, "big": 2**80},
    {"f": 1.5, "g": -0.0, "h": 1e100, "i": 1e-300, "j": 0.1 + 0.2, "k": 3.0},
    {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")},
    {"nested": {"b": [1, 2, {"z": None, "a": [True, 1.25]}], "a": {}}, "list": []},
    {"unicode": {"ключ": ["値", "🚀"], "é": {"ü": "ß"}}},
    {"layers": list(range(100)), "shape": [[1, 2], [3, 4]]},
    {"tuple": (1, "two", 3.0)},  # json.dumps writes a tuple as a list
]


def reference_fingerprint(fields: dict) -> str:
    if not fields:
        return ""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("fields", FIELDS, ids=range(len(FIELDS)))
def test_fingerprint_matches_the_reference(fields):
    expected = reference_fingerprint(fields)
    assert kvxfer.config_fingerprint(fields) == expected
    pool = np.zeros((1, 8), np.uint8)
    with kvxfer.Transport("fp", pool, config_fields=fields, backends=["LOOPBACK"]) as t:
        assert t.config_fingerprint == expected


def test_no_fields_means_an_empty_fingerprint():
    assert kvxfer.config_fingerprint({}) == ""
    assert kvxfer.config_fingerprint(None) == ""


def test_an_integer_and_its_string_are_different_fields():
    assert kvxfer.config_fingerprint({"block_size": 16}) != kvxfer.config_fingerprint(
        {"block_size": "16"}
    )


def test_peers_with_non_string_fields_agree(make_agent):
    fields = {"block_size": 16, "dtype": "bfloat16", "kv": {"layers": 32, "mla": False}}
    a = make_agent(config_fields=fields)
    same = make_agent(config_fields=dict(reversed(list(fields.items()))))
    other = make_agent(config_fields={**fields, "block_size": 32})
    connect(a, same, "same")
    with pytest.raises(ValueError, match="fingerprint"):
        connect(a, other, "other")


def test_peers_with_different_fingerprints_are_refused(make_agent):
    a = make_agent(config_fields={"model": "x"})
    same = make_agent(config_fields={"model": "x"})
    other = make_agent(config_fields={"model": "y"})
    connect(a, same, "same")
    with pytest.raises(ValueError, match="fingerprint"):
        connect(a, other, "other")


def test_a_peer_without_config_fields_is_refused_either_way(make_agent):
    # A tier must not take blocks from an engine whose configuration it
    # cannot check: one side declaring fields and the other none is refused,
    # and the message says which side declared what.
    declared = make_agent(config_fields={"model": "x"})
    silent = make_agent()
    with pytest.raises(ValueError, match="declares no config fields while we declare fingerprint"):
        connect(declared, silent, "silent")
    with pytest.raises(ValueError, match="while we declare no config fields"):
        connect(silent, declared, "declared")
