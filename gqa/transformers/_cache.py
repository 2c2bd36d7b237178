"""A transformers ``Cache`` over one ``gqa.KVCache``: the model's layers write their new keys
and values into gqa's caches (every KVCache format), in place, preallocated for
``max_length`` positions, and attend over them with gqa's fused-dequant kernels -- no
dequantized copy, no concatenation.

Contract with the installed transformers (``cache_utils.py``): ``update(key_states,
value_states, layer_idx)`` receives a layer's post-rotary (and post QK-norm) keys ``[B, Nkv, S,
H]``; here it only holds them and returns them tagged with their layer, and the attention
function (``_attention.py``) takes them from there: the operator writes them and attends in one
call.  ``get_seq_length`` is the number of columns transformers counts (padding included);
each sequence's own length is the KVCache's ``lengths`` (a left-padded prompt is written
without its padding: every sequence gets what it gets alone).
"""
import numpy as np
import torch
import transformers

from gqa import KVCache, cache_options

from . import _model

# the torch dtypes gqa computes in: float32 and float16 as they are, the others in float32
_NUMPY = {torch.float32: np.float32, torch.float16: np.float16}
# the float rows kept past the recent window (KVCache rollback_size): crop takes back that many
# positions over float windows -- transformers' speculative decoding verifies
# prompt_lookup_num_tokens (default 10) or num_assistant_tokens (20, growing by 2 while every
# candidate is accepted) candidates a step and crops the rejected ones
ROLLBACK_SIZE = 64
# KVCache keywords the Cache sets itself
_OWN = ("num_layers", "num_heads", "kv_num_heads", "head_size", "batch_size", "dtype",
        "local_window_size", "softcap", "scale")


class _Layer(transformers.cache_utils.CacheLayerMixin):
    """One model layer's view of the shared gqa cache (transformers' per-layer protocol)."""

    is_compileable = False
    is_croppable = True
    supports_early_init = False

    def __init__(self, owner, index):
        super().__init__()
        self.owner, self.index = owner, index
        self.is_sliding = owner.shapes[index].window >= 0
        self.pending = None      # this step's (key, value) until the attention takes them

    def lazy_initialization(self, key_states, value_states):
        self.owner._allocate(key_states)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.pending = (key_states, value_states)
        self.owner._seen[self.index] += key_states.shape[-2]
        handle = key_states.detach()
        handle._gqa_layer = self          # the attention function finds the cache through it
        return handle, value_states

    def get_seq_length(self):
        return self.owner._seen[self.index]

    def get_mask_sizes(self, query_length):
        return self.owner._seen[self.index] + query_length, 0

    def get_max_length(self):
        return self.owner.max_length

    def reset(self):
        self.owner._reset()

    # the layers share one KVCache: these are the Cache's, applied once to every layer
    def _whole_cache(self, *args):
        raise TypeError("gqa.transformers: the layers share one gqa.KVCache; call the Cache's "
                        "crop / reorder_cache / batch_select_indices / batch_repeat_interleave")

    crop = reorder_cache = batch_repeat_interleave = batch_select_indices = _whole_cache

    @property
    def batch_size(self):
        return self.owner.kv.batch_size if self.owner.kv is not None else -1

    def __repr__(self):
        return f"gqa.transformers layer {self.index} ({self.owner.mode})"


class Cache(transformers.Cache):
    """``gqa.transformers.Cache(model, mode="int4-g32+s4r64+had", max_length=8192)``, then
    ``model.generate(ids, cache=cache, ...)``.

    ``mode`` and the other keywords are ``gqa.KVCache``'s (configuration names, ``k_mode`` /
    ``v_mode``, ``k_scales`` / ``v_scales`` or a ``calibration`` from :func:`calibrate`,
    ``rotations``, ``sink_size`` / ``recent_size``, ``rollback_size``, ``num_threads``); the
    model's heads, head
    size, score scale, sliding windows and softcap are read from its attention modules.  Every
    option is checked here, by a KVCache for one sequence in the model's dtype, which a first
    step of one sequence keeps (another batch size gets its own).  ``rollback_size`` defaults
    to ``ROLLBACK_SIZE`` here: with float windows, ``crop`` (speculative decoding's rejected
    tokens) takes back up to that many positions.  Constructing the cache sets
    the model's attention to gqa's (``"gqa"``), which attends with transformers' sdpa wherever
    it is given another cache.
    """

    def __init__(self, model, mode="float", max_length=None, *, set_attention=True, **kvcache):
        from . import _attention
        config = _model._text_config(model)
        self.shapes = _model.layer_shapes(model)
        s0 = self.shapes[0]
        if any((s.num_heads, s.kv_num_heads, s.head_size) != (s0.num_heads, s0.kv_num_heads, s0.head_size)
               for s in self.shapes):
            raise ValueError("gqa.transformers: layers of different head counts or sizes are not supported")
        for key in _OWN:
            if key in kvcache:
                raise TypeError(f"gqa.transformers.Cache: {key} is read from the model (or the first "
                                "step), not given")
        self.mode = mode
        self.max_length = config.max_position_embeddings if max_length is None else max_length
        self.kvcache_options = dict(dict(rollback_size=ROLLBACK_SIZE), **kvcache, mode=mode)
        self.kv = None
        # every option is checked now, by a KVCache for one sequence in the model's dtype, and
        # not inside generate(); a first step of that batch and dtype keeps it
        self._probe = self._kvcache(1, np.dtype(_NUMPY.get(getattr(model, "dtype", None), np.float32)))
        self.max_length = self._probe.max_length
        self._seen = [0] * len(self.shapes)
        super().__init__(layers=[_Layer(self, i) for i in range(len(self.shapes))])
        _attention.register()
        if set_attention:
            model.set_attn_implementation("gqa")

    # -- the gqa cache ---------------------------------------------------------------------
    def _kvcache(self, batch_size, dtype):
        s0 = self.shapes[0]
        return KVCache(num_layers=len(self.shapes), num_heads=s0.num_heads, kv_num_heads=s0.kv_num_heads,
                       head_size=s0.head_size, max_length=self.max_length, batch_size=batch_size,
                       dtype=dtype, local_window_size=[s.window for s in self.shapes],
                       softcap=[s.softcap for s in self.shapes],
                       scale=[s.scale for s in self.shapes], **self.kvcache_options)

    def _allocate(self, key_states):
        """The KVCache of the first step's batch size and dtype."""
        if self.kv is not None:
            return
        s0 = self.shapes[0]
        B, Nkv, _, H = key_states.shape
        if (Nkv, H) != (s0.kv_num_heads, s0.head_size):
            raise ValueError(f"gqa.transformers: keys of {Nkv} heads of {H}, the model's modules "
                             f"say {s0.kv_num_heads} of {s0.head_size}")
        self.dtype = np.dtype(_NUMPY.get(key_states.dtype, np.float32))
        probe, self._probe = self._probe, None
        if probe is not None and (probe.batch_size, probe.dtype) == (B, self.dtype):
            self.kv = probe
        else:
            del probe
            self.kv = self._kvcache(B, self.dtype)

    def _reset(self):
        if self.kv is not None:
            self.kv.reset()
        self._seen = [0] * len(self.shapes)
        for layer in self.layers:
            layer.pending = None

    @property
    def nbytes(self):
        """Bytes of the caches (codes, scales, float windows); 0 before the first step."""
        return self.kv.nbytes if self.kv is not None else 0

    # -- transformers' Cache protocol, on the whole cache at once ----------------------------
    def reset(self):
        self._reset()

    def crop(self, tokens_to_remove):
        """Drop the last ``-tokens_to_remove`` positions of every sequence (transformers'
        convention: a count <= 0, and 0 removes nothing -- speculative decoding crops by 0
        when every candidate token was accepted; a positive one is the length to keep).  Over
        float windows it reaches back to the KVCache's ``rollback_floor``, else ValueError
        (``KVCache.truncate``'s), nothing changed."""
        if self.kv is None:
            return
        seen = self._seen[0]
        keep = seen + tokens_to_remove if tokens_to_remove <= 0 else min(tokens_to_remove, seen)
        drop = seen - max(keep, 0)
        if drop:
            self.kv.truncate(np.maximum(self.kv.lengths - drop, 0))
            self._seen = [max(s - drop, 0) for s in self._seen]

    def _take(self, indices):
        if self.kv is not None:
            self.kv = self.kv.take(np.asarray(torch.as_tensor(indices).cpu(), np.int64))

    def reorder_cache(self, beam_idx):
        self._take(beam_idx)

    def batch_select_indices(self, indices):
        self._take(indices)

    def batch_repeat_interleave(self, repeats):
        if self.kv is not None:
            self._take(np.repeat(np.arange(self.kv.batch_size), repeats))

    def __repr__(self):
        return f"gqa.transformers.Cache(mode={self.mode!r}, max_length={self.max_length}, kv={self.kv!r})"
