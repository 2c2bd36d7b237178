"""The layer-loop rows of ``python -m gqa bench --layers L``: decode as a model runs it.

One token visits L layers in turn.  Each layer has its own cache (capacity T holding T - 1
rows, updated in place) and its own inputs, and a float32 projection ``x @ W`` (NumPy; W is
PROJ x PROJ, shared by the layers like a model's matrices share the BLAS) runs before each
attention call.  Only the attention calls are timed (perf_counter around each), so a row's
figure is attention time per layer inside the loop -- what the projections' thread pool,
the caches of the other layers and the wake-up of gqa's own threads cost it -- to be read
beside the same call back to back (the row's ``decode`` figure in the same run).

Sides: ``gqa`` (a kept GroupQueryAttention per layer), ``gqa-fn`` (gqa.group_query_attention
per call), ``gqa@L`` (with ``--vs-level L``: a kept operator per layer with its own
accuracy_level L) and ``ort`` (one onnxruntime session shared by the layers, one IOBinding per layer
on its own buffers, in place; onnxruntime's default thread pool, as a user gets it).
"""
import time

import numpy as np

PROJ = 1024


class LayerSide:
    """A side of a layer row: `prepare(spec)` -> one layer's no-argument call."""

    def __init__(self, name, prepare):
        self.name, self._prepare = name, prepare
        self.calls = self.W = self.x = None

    def setup(self, spec):
        L = spec["layers"]
        calls = [self._prepare(dict(spec, seed=spec["seed"] * 1000 + i)) for i in range(L)]
        if any(c is None for c in calls):
            return False
        rng = np.random.default_rng(spec["seed"])
        self.W = rng.standard_normal((PROJ, PROJ), dtype=np.float32) / np.float32(PROJ ** 0.5)
        self.x = rng.standard_normal((1, PROJ), dtype=np.float32)
        self.calls = calls
        self.per_call = L          # bench.measure_row: a call of this side is L layers
        return True

    def _token(self):
        """One token through every layer; -> seconds spent in the attention calls."""
        clock = time.perf_counter
        spent = 0.0
        x, W = self.x, self.W
        for call in self.calls:
            x @ W
            t0 = clock()
            call()
            spent += clock() - t0
        return spent

    def time(self, inner, warm):
        """Attention seconds per layer over `inner` tokens (a warm token first)."""
        if warm:
            self._token()
        spent = sum(self._token() for _ in range(inner))
        return spent / (inner * len(self.calls))

    def teardown(self):
        self.calls = self.W = self.x = None
