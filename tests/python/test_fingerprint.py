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


def test_peers_with_different_fingerprints_are_refused(make_agent):
    a = make_agent(config_fields={"model": "x"})
    same = make_agent(config_fields={"model": "x"})
    other = make_agent(config_fields={"model": "y"})
    connect(a, same, "same")
    with pytest.raises(ValueError, match="fingerprint"):
        connect(a, other, "other")
