"""The flash path (tiled online softmax, flash decoding, multi-token steps on the decode
kernels) against the naive path: the tolerances and the check."""
import numpy as np

import gqa

# max |flash - naive| per cache: summation orders of float32 products
TOL = {("PER_TENSOR", 8): 1e-4, ("PER_CHANNEL", 8): 1e-4, ("PER_TENSOR", 4): 1e-3,
       ("PER_CHANNEL", 4): 1e-3, ("NONE", 0): 1e-5}
MODES = list(TOL)
MODE_IDS = ["s8pt", "s8pc", "s4pt", "s4pc", "float"]


def flash_vs_naive(inp, a, tol, blocks=None, splits=None, threads=2):
    """The call on both paths (the flash one with these tile sizes and decode splits): the same
    caches, outputs within tol; the flash path's result."""
    with gqa.config(flash=False):
        naive = gqa.group_query_attention(**inp, **a, num_threads=threads)
    with gqa.config(flash=True, flash_blocks=blocks, decode_splits=splits):
        flash = gqa.group_query_attention(**inp, **a, num_threads=threads)
    assert np.array_equal(naive[1], flash[1]) and np.array_equal(naive[2], flash[2])
    np.testing.assert_allclose(flash[0].astype(np.float64), naive[0].astype(np.float64), atol=tol, rtol=0)
    return flash
