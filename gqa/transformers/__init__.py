"""gqa's caches under Hugging Face transformers' ``generate()`` (the ``transformers`` extra:
``pip install "gqa[transformers]"``; gqa never builds against torch: CPU tensors pass to gqa as
NumPy arrays and back).

    cache = gqa.transformers.Cache(model, mode="int4-g32+s4r64+had", max_length=8192)
    out = model.generate(ids, cache=cache, max_new_tokens=64)

:class:`Cache` is a ``transformers.Cache`` over one ``gqa.KVCache`` (every format, in place,
preallocated); the attention function ``"gqa"`` (registered on import) attends over it with the fused-dequant kernels, the prompt included.
:func:`calibrate` measures the static scales of the INT8/INT4 per-tensor / per-channel modes
by running a text through the model.
"""
import torch

from ._attention import attention_forward, register
from ._cache import ROLLBACK_SIZE, Cache

__all__ = ["Cache", "ROLLBACK_SIZE", "attention_forward", "calibrate", "register"]

register()      # importing gqa.transformers makes attn_implementation="gqa" available


def calibrate(model, input_ids, max_length=None):
    """A ``gqa.Calibration`` (per layer and channel maxima of the cached K and V) from running
    ``input_ids`` (``[1, T]``) through ``model`` with a float gqa cache; give it to
    ``Cache(model, mode="int8-pc", calibration=...)``."""
    ids = torch.as_tensor(input_ids)
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [1, T] (one calibration text), got {tuple(ids.shape)}")
    cache = Cache(model, "float", max_length=max_length or ids.shape[1])
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    return cache.kv.calibration()
