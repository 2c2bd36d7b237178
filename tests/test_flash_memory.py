"""Prefill memory: scratch is O(threads x tile), independent of T, but for the packed K / V tiles
a thread keeps at accuracy levels 3-4 on matrix tiles (at most 16 MiB more a thread).
S = T = 16384 on the seed shape (INT8), at levels 0 and 3, must add less than 64 MiB of peak
RSS beyond its inputs and outputs."""
import os
import subprocess
import sys
import textwrap

import pytest

import gqa

SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import gqa
    S, N, NKV, H, level = int(sys.argv[1]), 16, 8, 128, int(sys.argv[2])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, S, N * H), dtype=np.float32)
    k = rng.standard_normal((1, S, NKV * H), dtype=np.float32)
    v = rng.standard_normal((1, S, NKV * H), dtype=np.float32)
    kc = np.ones((1, NKV, S, H), np.int8)
    vc = np.ones((1, NKV, S, H), np.int8)
    s = np.full(1, 0.02, np.float32)
    op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_TENSOR",
                                 v_quant_type="PER_TENSOR", kv_cache_bit_width=8,
                                 accuracy_level=level)
    # warm up the code paths and the thread team on a small call
    op(q[:, :64], k[:, :64], v[:, :64], kc[:, :, :64].copy(), vc[:, :, :64].copy(),
       np.array([63], np.int32), 64, k_scale=s, v_scale=s)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = op(q, k, v, kc, vc, np.array([S - 1], np.int32), S, k_scale=s, v_scale=s,
             present_key=kc, present_value=vc)[0]
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert np.isfinite(out[0, -1]).all()
    print(after - before - out.nbytes)
""")


@pytest.mark.parametrize("level", [0, 3])
def test_prefill_16k_extra_peak_rss_under_64mib(level):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(gqa.__file__)))
    r = subprocess.run([sys.executable, "-c", SCRIPT, "16384", str(level)], capture_output=True,
                       text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    extra = int(r.stdout.strip().splitlines()[-1])
    assert extra < 64 * 2**20, f"prefill used {extra / 2**20:.1f} MiB beyond inputs and outputs"
