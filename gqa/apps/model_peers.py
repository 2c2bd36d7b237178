"""Other attentions for the real-model loop, as drop-in KVCache subclasses.

Each keeps KVCache's buffers, lengths and checks and replaces only ``_run`` (one layer's
attention for the step, caches updated in place):

- ``NumpyAttention``: a float32 cache and plain NumPy attention (rotary, then per KV group
  ``softmax(scale * q K^T + causal mask) V`` with matrix products): the reference of the
  model tests and the "NumPy float attention" side of ``python -m gqa eval``.
- ``OrtAttention``: onnxruntime 1.31.1's ``com.microsoft.GroupQueryAttention`` on the same
  cache buffers (IOBinding, past and present bound to one buffer, in place), one session for
  every layer (all layers share a signature) and one IOBinding per layer; ``spinning=False``
  sets ``session.intra_op.allow_spinning=0``.
"""
import numpy as np

from . import ort_peer as _ort_peer
from gqa import KVCache


def _split_packed(query, key, value, N, Nkv, H):
    if key is not None:
        return query, key, value
    q, kv = N * H, Nkv * H
    return query[..., :q], query[..., q:q + kv], query[..., q + kv:]


def apply_rotary_interleaved(x, cos, sin):
    """x [B, S, heads, D] rotated by pairs (2i, 2i+1) with cos/sin [S, rot/2]; the channels
    past the rotary width are left alone (float32)."""
    r = 2 * cos.shape[-1]
    y = x.copy()
    a, b = x[..., 0:r:2], x[..., 1:r:2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    y[..., 0:r:2] = a * c - b * s
    y[..., 1:r:2] = a * s + b * c
    return y


class NumpyAttention(KVCache):
    """Float32 cache, NumPy attention (causal, rotary interleaved or none)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("mode", "float")
        super().__init__(**kwargs)
        if self.quantized:
            raise ValueError("NumpyAttention is a float cache")
        if self.cos_cache is not None and not self.ops[0].rotary_interleaved:
            raise ValueError("NumpyAttention implements the interleaved rotary only")
        self._scale = self.ops[0].scale or 1.0 / np.sqrt(self.head_size)

    def _run(self, layer, query, key, value, T):
        B, S = query.shape[:2]
        N, Nkv, H = self.num_heads, self.kv_num_heads, self.head_size
        G, P = N // Nkv, T - S
        q, k, v = _split_packed(query, key, value, N, Nkv, H)
        q, k = q.reshape(B, S, N, H), k.reshape(B, S, Nkv, H)
        if self.cos_cache is not None:
            cos, sin = self.cos_cache[P:T], self.sin_cache[P:T]
            q, k = apply_rotary_interleaved(q, cos, sin), apply_rotary_interleaved(k, cos, sin)
        K, V = self.key[layer], self.value[layer]
        K[:, :, P:T] = k.transpose(0, 2, 1, 3)
        V[:, :, P:T] = v.reshape(B, S, Nkv, H).transpose(0, 2, 1, 3)
        # [B, Nkv, G*S, H]: query row (g, s) of KV group j is head j*G + g at step row s
        qg = q.transpose(0, 2, 1, 3).reshape(B, Nkv, G * S, H)
        scores = (qg @ K[:, :, :T].swapaxes(-1, -2)) * np.float32(self._scale)
        if S > 1:
            rows = np.tile(np.arange(P, T), G)                      # each row's own position
            scores[..., np.arange(T)[None, :] > rows[:, None]] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out = p @ V[:, :, :T]                                       # [B, Nkv, G*S, H]
        return np.ascontiguousarray(out.reshape(B, Nkv, G, S, H).transpose(0, 3, 1, 2, 4)
                                    ).reshape(B, S, N * H)


class OrtAttention(KVCache):
    """onnxruntime 1.31.1's GroupQueryAttention on this cache's buffers, in place."""

    def __init__(self, *, threads=2, spinning=True, **kwargs):
        if not _ort_peer.available():
            raise RuntimeError(f"onnxruntime {_ort_peer.ORT_VERSION} and onnx are needed "
                               "(pip install \"gqa[test]\")")
        super().__init__(**kwargs)
        if self.k_format.grouped or self.k_format.quant != self.v_format.quant:
            raise ValueError(f"onnxruntime 1.31.1 takes float or static quantized caches with "
                             f"k_quant_type == v_quant_type, not mode {self.mode!r}")
        op = self.ops[0]
        self._attrs = dict(num_heads=self.num_heads, kv_num_heads=self.kv_num_heads,
                           do_rotary=op.do_rotary, rotary_interleaved=op.rotary_interleaved,
                           k_quant_type=op.k_quant_type, v_quant_type=op.v_quant_type,
                           kv_cache_bit_width=op.kv_cache_bit_width)
        self._threads = threads
        self._config = {} if spinning else {"session.intra_op.allow_spinning": "0"}
        self._total = np.zeros(1, np.int32)
        self._bindings = [None] * self.num_layers
        self._sess = None

    def _binding(self, layer, query):
        ort = _ort_peer.ort
        if self._sess is None:
            inputs = dict(query=query, past_key=self.key[0], past_value=self.value[0],
                          seqlens_k=self._seqlens, total_sequence_length=self._total,
                          cos_cache=self.cos_cache, sin_cache=self.sin_cache,
                          k_scale=self.k_scales[0], v_scale=self.v_scales[0])
            self._sess = _ort_peer.session(inputs, self._attrs, self._threads, self._config)
        if self._bindings[layer] is None:
            io = self._sess.io_binding()
            k = ort.OrtValue.ortvalue_from_numpy(self.key[layer])     # shares the buffer
            v = ort.OrtValue.ortvalue_from_numpy(self.value[layer])
            io.bind_ortvalue_input("past_key", k)
            io.bind_ortvalue_input("past_value", v)
            io.bind_ortvalue_output("present_key", k)
            io.bind_ortvalue_output("present_value", v)
            for name, x in (("cos_cache", self.cos_cache), ("sin_cache", self.sin_cache),
                            ("k_scale", self.k_scales[layer]), ("v_scale", self.v_scales[layer])):
                if x is not None:
                    io.bind_cpu_input(name, x)
            self._bindings[layer] = (io, k, v)
        return self._bindings[layer][0]

    def _run(self, layer, query, key, value, T):
        if key is not None:
            query = np.concatenate([query, key, value], axis=-1)
        query = np.ascontiguousarray(query, self.dtype)
        io = self._binding(layer, query)
        self._total[0] = T
        io.bind_cpu_input("query", query)
        io.bind_cpu_input("seqlens_k", self._seqlens)
        io.bind_cpu_input("total_sequence_length", self._total)
        out = np.empty(query.shape[:2] + (self.num_heads * self.head_size,), self.dtype)
        io.bind_output("output", "cpu", 0, self.dtype, out.shape, out.ctypes.data)
        self._sess.run_with_iobinding(io)
        return out
