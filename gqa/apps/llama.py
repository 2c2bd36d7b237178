"""A Llama-family decoder in NumPy with gqa's GroupQueryAttention as its attention.

The network (float32 throughout): token embedding; per layer ``x += Wo · attn(RMSNorm(x))``
and ``x += Wd · (silu(Wg · h) * (Wu · h))`` with ``h = RMSNorm(x)``; a final RMSNorm; logits
from the output matrix (the embedding when the file ties them).  ``RMSNorm(x) = x /
sqrt(mean(x^2) + eps) * w``.  The attention is the cache's: ``cache.attend(layer, qkv, None,
None)`` with the packed ``[B, S, (N + 2 Nkv) H]`` projection (one matrix product per layer);
rotary is applied by the operator at absolute positions with ``rotary_interleaved=1``, which
is what GGUF's permuted Q/K weights mean.  Any object with that ``attend`` method and a
``length`` can stand in for the cache (gqa/apps/model_peers.py: NumPy and onnxruntime attention).

``Llama.load()`` reads the GGUF file (gqa/apps/gguf.py).
"""
import time

import numpy as np

from gqa import KVCache, rotary_caches


def rms_norm(x, w, eps):
    """x / sqrt(mean(x^2, last axis) + eps) * w, float32."""
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))) * w


class _Layer:
    __slots__ = ("attn_norm", "wqkv", "wo", "ffn_norm", "wgu", "wd")


class Llama:
    """Weights, tokenizer and shape of one model; ``forward`` runs tokens through it."""

    def __init__(self, meta, weights, tokenizer=None, chat_template=None):
        self.meta = meta
        self.name = meta["name"]
        self.num_layers, self.dim, self.ffn = meta["num_layers"], meta["dim"], meta["ffn"]
        self.num_heads, self.kv_num_heads = meta["num_heads"], meta["kv_num_heads"]
        self.head_size, self.rms_eps = meta["head_size"], meta["rms_eps"]
        self.context_length, self.eos_id = meta["context_length"], meta["eos_id"]
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self.embed = weights["token_embd.weight"]                 # [V, D]
        self.output = weights.get("output.weight", self.embed)    # [V, D], tied when absent
        self.out_norm = weights["output_norm.weight"]
        self.vocab = self.embed.shape[0]
        self.layers = [self._layer(lambda n, i=i: weights[f"blk.{i}.{n}.weight"])
                       for i in range(self.num_layers)]
        q, kv = self.num_heads * self.head_size, self.kv_num_heads * self.head_size
        if self.layers and self.layers[0].wqkv.shape != (self.dim, q + 2 * kv):
            raise ValueError(f"attention weights of shape {self.layers[0].wqkv.shape} do not match "
                             f"N={self.num_heads}, Nkv={self.kv_num_heads}, H={self.head_size}")
        self._rotary = None
        self.attention_seconds = 0.0   # time inside cache.attend, summed over calls

    _Layer = _Layer

    def _layer(self, w):
        """One layer's weights; ``w(name)`` reads ``blk.<i>.<name>.weight``."""
        lay = self._Layer()
        lay.attn_norm, lay.ffn_norm = w("attn_norm"), w("ffn_norm")
        # [in, out] so that x @ W; Q | K | V side by side is the operator's packed QKV
        lay.wqkv = np.ascontiguousarray(np.concatenate([w("attn_q"), w("attn_k"), w("attn_v")]).T)
        lay.wo = np.ascontiguousarray(w("attn_output").T)
        lay.wgu = np.ascontiguousarray(np.concatenate([w("ffn_gate"), w("ffn_up")]).T)
        lay.wd = np.ascontiguousarray(w("ffn_down").T)
        return lay

    @classmethod
    def load(cls, path=None):
        """The model of the GGUF file at ``path`` (default: gqa/_gguf.model_path())."""
        from . import gguf as _gguf
        return cls(*_gguf.read(path or _gguf.model_path()))

    # -- caches ---------------------------------------------------------------------------
    def rotary(self, length):
        """cos/sin caches for positions [0, length) (computed once for the longest asked)."""
        if self._rotary is None or self._rotary[0].shape[0] < length:
            self._rotary = rotary_caches(max(length, self.context_length), self.meta["rope_dim"],
                                         self.meta["rope_base"])
        return self._rotary

    def new_cache(self, max_length, mode="float", cls=KVCache, **kwargs):
        """A KVCache (or subclass ``cls``) of this model's shape, rotary set up; kwargs go to it."""
        return cls(num_layers=self.num_layers, num_heads=self.num_heads,
                       kv_num_heads=self.kv_num_heads, head_size=self.head_size,
                       max_length=max_length, mode=mode, rotary=self.rotary(max_length),
                       rotary_interleaved=1, **kwargs)

    # -- the network ----------------------------------------------------------------------
    def forward(self, tokens, cache, on_layer=None):
        """Final hidden states ``[B, S, D]`` (after the last norm) of ``tokens [B, S]``, the
        positions after ``cache.length``; the cache gains them.  ``on_layer(i)`` after each layer."""
        tokens = np.asarray(tokens)
        if tokens.ndim == 1:
            tokens = tokens[None]
        x = self._embedding(tokens)
        with np.errstate(over="ignore"):
            for i, lay in enumerate(self.layers):
                self._block(i, lay, x, cache)
                if on_layer is not None:
                    on_layer(i)
        return rms_norm(x, self.out_norm, self.rms_eps)

    def _embedding(self, tokens):
        return self.embed[tokens]

    def _attention(self, i, lay, h, cache):
        """Layer i's attention output projected back (``Wo · attn``) for the normed states h; the
        cache's attend call alone is timed into ``attention_seconds``."""
        qkv = h @ lay.wqkv
        t0 = time.perf_counter()
        a = cache.attend(i, qkv, None, None)
        self.attention_seconds += time.perf_counter() - t0
        return a @ lay.wo

    def _block(self, i, lay, x, cache):
        """Layer i, in place on the residual stream x."""
        eps, F = self.rms_eps, self.ffn
        x += self._attention(i, lay, rms_norm(x, lay.attn_norm, eps), cache)
        gu = rms_norm(x, lay.ffn_norm, eps) @ lay.wgu
        g = gu[..., :F]
        x += (g / (1.0 + np.exp(-g)) * gu[..., F:]) @ lay.wd

    def logits(self, hidden):
        return hidden @ self.output.T

    def calibration(self, tokens, chunk=512, rotary_pairs=True):
        """A Calibration (gqa/_kvcache.py) from a float-cache run over ``tokens`` (1-D),
        prefilled in chunks of ``chunk``."""
        tokens = np.asarray(tokens)
        cache = self.new_cache(len(tokens))
        for pos in range(0, len(tokens), chunk):
            self.forward(tokens[None, pos:pos + chunk], cache)
        return cache.calibration(rotary_pairs)

    def calibrate_rotations(self, tokens, chunk=512):
        """Per layer ``(R_K, R_V)`` (gqa/_rotation.py, onnxruntime main's OSCAR recipe) from a
        float-cache run over ``tokens``: the covariances of each KV head's post-rotary queries
        and of its attention outputs, their eigenvectors, then the Hadamard and bit-reversal."""
        from gqa import calibrate_rotations
        tokens = np.asarray(tokens)
        cache = self.new_cache(len(tokens), cls=_RotationRecorder)
        for pos in range(0, len(tokens), chunk):
            self.forward(tokens[None, pos:pos + chunk], cache)
        return calibrate_rotations(cache.query_cov, cache.output_cov)

    # -- uses -----------------------------------------------------------------------------
    def encode(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat_prompt(self, user_text, system=None):
        """Token ids of a one-turn chat, rendered with the model's chat template."""
        from .gguf import render_chat
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user_text}]
        return self.encode(render_chat(self.chat_template, msgs))

    def generate(self, prompt_ids, cache, max_new_tokens, on_token=None, on_layer=None):
        """Greedy decoding: prefill ``prompt_ids`` in one step, then one token per step until
        the end-of-sequence token or ``max_new_tokens``.  ``on_token(id)`` for each new token.
        -> dict(ids, prefill_s, decode_s, decode_attention_s)."""
        t0 = time.perf_counter()
        h = self.forward(np.asarray(prompt_ids)[None], cache, on_layer)
        nxt = int(np.argmax(self.logits(h[0, -1])))
        t1 = time.perf_counter()
        a0 = self.attention_seconds
        ids = []
        while True:
            ids.append(nxt)
            if on_token is not None:
                on_token(nxt)
            if nxt == self.eos_id or len(ids) >= max_new_tokens:
                break
            h = self.forward(np.array([[nxt]]), cache)
            nxt = int(np.argmax(self.logits(h[0, -1])))
        t2 = time.perf_counter()
        return dict(ids=ids, prefill_s=t1 - t0, decode_s=t2 - t1, decode_steps=len(ids) - 1,
                    decode_attention_s=self.attention_seconds - a0)

    def score(self, tokens, cache, decode_tail=32, chunk=512, tail_step=1):
        """Teacher-forced next-token scores of ``tokens`` (1-D): positions ``[0, n - 1 -
        decode_tail)`` prefilled in chunks of ``chunk``, the last ``decode_tail`` in steps of
        ``tail_step`` tokens (1: one decode step each; more: speculative decoding's verification
        steps).  -> (nll float64 [n - 1] of tokens[1:], top-1 ids int [n - 1])."""
        tokens = np.asarray(tokens)
        n = len(tokens) - 1
        tail = min(decode_tail, n)
        nll, top = np.empty(n), np.empty(n, np.int64)
        pos = 0
        while pos < n:
            step = min(chunk, n - tail - pos) if pos < n - tail else min(tail_step, n - pos)
            h = self.forward(tokens[None, pos:pos + step], cache)[0]
            z = self.logits(h)
            m = z.max(axis=-1, keepdims=True)
            lse = np.log(np.exp(z - m).sum(axis=-1, dtype=np.float64)) + m[:, 0]
            target = tokens[pos + 1:pos + step + 1]
            nll[pos:pos + step] = lse - z[np.arange(step), target]
            top[pos:pos + step] = z.argmax(axis=-1)
            pos += step
        return nll, top


class _RotationRecorder(KVCache):
    """A float KVCache that also sums, per layer and KV head, q^T q of the post-rotary queries
    and o^T o of the attention outputs of the head's query group (float64)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        shape = (self.kv_num_heads, self.head_size, self.head_size)
        self.query_cov = [np.zeros(shape) for _ in range(self.num_layers)]
        self.output_cov = [np.zeros(shape) for _ in range(self.num_layers)]

    def _run(self, layer, query, key, value, T):
        out = super()._run(layer, query, key, value, T)
        B, S, _ = query.shape
        N, Nkv, H = self.num_heads, self.kv_num_heads, self.head_size
        q = query[..., :N * H].reshape(B, S, N, H).astype(np.float64)
        cos = self.cos_cache[T - S:T].astype(np.float64)[None, :, None, :]
        sin = self.sin_cache[T - S:T].astype(np.float64)[None, :, None, :]
        r = 2 * cos.shape[-1]
        x0, x1 = q[..., 0:r:2].copy(), q[..., 1:r:2].copy()     # interleaved pairs
        q[..., 0:r:2] = x0 * cos - x1 * sin
        q[..., 1:r:2] = x0 * sin + x1 * cos
        o = out.reshape(B, S, N, H).astype(np.float64)
        G = N // Nkv
        for j in range(Nkv):
            qs = q[:, :, j * G:(j + 1) * G].reshape(-1, H)
            os_ = o[:, :, j * G:(j + 1) * G].reshape(-1, H)
            self.query_cov[layer][j] += qs.T @ qs
            self.output_cov[layer][j] += os_.T @ os_
        return out
