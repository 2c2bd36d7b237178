"""What a transformers model's attention layers are, read once from the model: per layer the
heads, head size, score scale, sliding window and softcap its attention module passes to the
attention function (``scaling``, ``sliding_window``, ``softcap``: the installed transformers'
contract, ``integrations/sdpa_attention.py``)."""
from typing import NamedTuple, Optional


class LayerShape(NamedTuple):
    num_heads: int
    kv_num_heads: int
    head_size: int
    scale: float
    window: int                # local_window_size: keys a query sees (-1: all)
    softcap: float             # 0: none


def _text_config(model):
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def attention_modules(model):
    """The attention modules by layer index (a module with ``layer_idx`` and ``scaling``)."""
    found = {}
    for m in model.modules():
        if hasattr(m, "layer_idx") and hasattr(m, "scaling") and hasattr(m, "head_dim"):
            found.setdefault(int(m.layer_idx), m)
    return [found[i] for i in sorted(found)]


def layer_shapes(model):
    """LayerShape of every attention layer, in order."""
    config = _text_config(model)
    mods = attention_modules(model)
    if not mods or len(mods) != config.num_hidden_layers:
        raise ValueError(f"gqa.transformers: found {len(mods)} attention modules (with layer_idx, "
                         f"scaling, head_dim) in a model of {config.num_hidden_layers} layers; "
                         f"{type(model).__name__} is not a decoder this integration reads")
    N = config.num_attention_heads
    Nkv = getattr(config, "num_key_value_heads", None) or N
    out = []
    for m in mods:
        window = _window(m, config)
        softcap = getattr(m, "attn_logit_softcapping", None) or 0.0
        out.append(LayerShape(N, Nkv, int(m.head_dim), float(m.scaling), window, float(softcap)))
    return out


def _window(module, config) -> int:
    """The sliding window the module passes (its own ``sliding_window``, else Mistral's and
    Phi-3's ``config.sliding_window``); transformers' window W keeps keys (q - W, q], which is
    the operator's local_window_size W."""
    w: Optional[int]
    if hasattr(module, "sliding_window"):
        w = module.sliding_window
    else:
        w = getattr(config, "sliding_window", None)
    return -1 if w is None else int(w)
