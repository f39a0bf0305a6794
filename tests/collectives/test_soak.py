"""Bounded soak: 4 ranks run a few thousand random collectives (kind, dtype, op, size) and check each
against a result computed locally from the known inputs; resident memory and file descriptors must stay
flat. The full 20,000-collective run is benchmarks/soak.py.
"""
import os
import sys

import pytest

from harness import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from soak import soak_body  # noqa: E402


@pytest.mark.parametrize("hosts", [None, "a,b,a,b"])
def test_soak_bounded(hosts):
    env = {"RINGZERO_SHM_BUFFER_BYTES": "65536", "RINGZERO_TIMEOUT_S": "120"}
    if hosts:
        env["RINGZERO_HOST_IDS"] = hosts
    steps = 2500 if hosts is None else 800
    results = run_ranks(4, soak_body, steps, 90.0, 7, env=env, timeout_s=400)
    for r in results:
        assert r["collectives"] >= 300, results
        assert r["rss_growth_bytes"] < 16 << 20, results  # trimmed RSS grows 0.3-0.6 MiB (soak.py _rss_bytes)
        assert r["fd_growth"] == 0, results
