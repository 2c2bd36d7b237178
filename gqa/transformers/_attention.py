"""gqa's attention function and mask function for transformers (``AttentionInterface`` /
``AttentionMaskInterface``, name ``"gqa"``).

The attention function receives the query ``[B, N, S, H]`` and the key its layer's
``Cache.update`` returned; where that key carries a gqa layer (``_cache.py``), the layer's
operator writes the step's keys and values into the gqa caches and attends over them in one
call, else the call is transformers' sdpa.  The mask function hands over the 2D padding mask
(``[B, kv_length]`` bool, or None when nothing is padded): the operator's causal, windowed,
ragged attention needs no 4D mask.  A prompt step (an empty cache) may be padded on either
side: each sequence's real tokens are written at positions ``[0, n_b)`` without the padding,
so that it gets what it gets alone; later steps must not be padded.
"""
import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

NAME = "gqa"


def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
         attention_mask=None, **kwargs):
    """The 2D padding mask of the last kv_length columns, or None when nothing is padded."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    return None if bool(attention_mask.all()) else attention_mask


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, **kwargs):
    layer = getattr(key, "_gqa_layer", None)
    if layer is None:      # another cache, or none: sdpa with the 4D mask of the 2D one
        if attention_mask is not None or sliding_window is not None:
            attention_mask = _full_mask(attention_mask, query, key, sliding_window)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, softcap=softcap, **kwargs)
    if dropout:
        raise ValueError("gqa.transformers attends at inference only (dropout must be 0)")
    return attend(layer, query, attention_mask, scaling, sliding_window, softcap), None


def _full_mask(padding, query, key, window):
    """[B, 1, S, T] bool: causal, within the sliding window, not padding (the queries are the
    last S of the T positions)."""
    S, T = query.shape[2], key.shape[2]
    q = torch.arange(T - S, T, device=query.device)[:, None]
    k = torch.arange(T, device=query.device)[None, :]
    allowed = k <= q
    if window is not None:
        allowed = allowed & (k > q - window)
    allowed = allowed[None, None]
    if padding is not None:
        allowed = allowed & padding[:, None, None, -T:].bool()
    return allowed


def _check_attributes(layer, scaling, sliding_window, softcap):
    shape = layer.owner.shapes[layer.index]
    got = (float(scaling) if scaling is not None else shape.scale,
           -1 if sliding_window is None else int(sliding_window), float(softcap or 0.0))
    if (abs(got[0] - shape.scale) > 1e-12 * abs(shape.scale) or got[1] != shape.window
            or got[2] != shape.softcap):
        raise ValueError(f"gqa.transformers: layer {layer.index} was read as (scale, window, "
                         f"softcap) = {(shape.scale, shape.window, shape.softcap)} but attends "
                         f"with {got}")


_TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}


def _rows(x, dtype):
    """[B, heads, S, H] torch -> C-contiguous [B, S, heads * H] NumPy of dtype: a view for a
    one-token step of the model's dtype, else one copy."""
    B, h, S, H = x.shape
    t = x.detach()
    if t.dtype != _TORCH[dtype]:
        t = t.to(_TORCH[dtype])
    a = t.numpy().transpose(0, 2, 1, 3).reshape(B, S, h * H)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def attend(layer, query, attention_mask, scaling, sliding_window, softcap):
    """The step of one layer: output [B, S, N, H] in the query's dtype."""
    _check_attributes(layer, scaling, sliding_window, softcap)
    owner, kv = layer.owner, layer.owner.kv
    key_states, value_states = layer.pending
    layer.pending = None
    dt = owner.dtype
    B, N, S, H = query.shape
    q, k, v = _rows(query, dt), _rows(key_states, dt), _rows(value_states, dt)
    new = None if attention_mask is None else attention_mask[:, -S:].cpu().numpy().astype(bool)
    if kv.length == 0 and new is not None and not new.all():
        out = _padded_prompt(layer.index, kv, q, k, v, new)
    else:
        if new is not None and not new.all():
            raise ValueError("gqa.transformers: padding in a step after the prompt (the prompt step "
                             "may be padded on either side; later tokens may not)")
        out = kv.attend(layer.index, q, k, v)
    out = torch.from_numpy(out).view(B, S, N, H)
    return out if out.dtype == query.dtype else out.to(query.dtype)


def _padded_prompt(index, kv, q, k, v, real):
    """A padded prompt into an empty cache: each sequence's real rows moved to the front
    (KVCache's lengths=), attended, and the outputs put back (padding rows: 0)."""
    n = real.sum(axis=1)
    if (n == 0).any():
        raise ValueError("gqa.transformers: a sequence of the batch has no token (all padding)")
    S = int(n.max())
    order = [np.flatnonzero(r) for r in real]
    gather = lambda x: np.stack([np.pad(x[b, o], ((0, S - len(o)), (0, 0))) for b, o in enumerate(order)])  # noqa: E731
    out_c = kv.attend(index, gather(q), gather(k), gather(v), lengths=n)
    out = np.zeros(q.shape[:2] + (out_c.shape[2],), out_c.dtype)
    for b, o in enumerate(order):
        out[b, o] = out_c[b, :len(o)]
    return out


_registered = False


def register():
    """Register ``"gqa"`` with transformers' attention and mask interfaces (idempotent)."""
    global _registered
    if not _registered:
        AttentionInterface.register(NAME, attention_forward)
        AttentionMaskInterface.register(NAME, mask)
        _registered = True
