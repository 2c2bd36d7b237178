"""SmolLM2-135M-Instruct through Hugging Face transformers (the demo and transformers extras;
skipped otherwise): one decode step of ``model(token, cache=...)`` at total length T with
DynamicCache + sdpa and with gqa.transformers caches, the cache holding T - 1 positions of the
evaluation text and rolled back (``crop(-1)``) after each step."""
import importlib.util
import timeit

from .common import gqa  # noqa: F401  (the gqa under test: source tree or installed)

_LOADED = []


def _model():
    from gqa.apps import gguf as _gguf
    if not _gguf.available():
        raise NotImplementedError(f"the real model is not installed: {_gguf.INSTALL_HINT}")
    for m in ("torch", "transformers", "accelerate"):
        if importlib.util.find_spec(m) is None:
            raise NotImplementedError(f"{m} is not installed (the transformers extra)")
    if not _LOADED:
        from gqa.apps import hf
        _LOADED.append(hf.load_model())
    return _LOADED[0]


class TransformersDecode:
    params = [["DynamicCache", "float", "int8-g32", "int4-g32+s4r64+had"], [1024, 4096]]
    param_names = ["cache", "T"]
    timer = timeit.default_timer
    timeout = 900
    number = 3
    repeat = (2, 5, 30.0)

    def setup(self, cache, T):
        import torch
        from transformers import DynamicCache
        import gqa.transformers as gt
        from gqa.apps import texts
        self.model, tok = _model()
        ids = torch.tensor([tok.encode(texts.evaluation_text()).ids[:T]])
        if cache == "DynamicCache":
            self.model.set_attn_implementation("sdpa")
            self.cache = DynamicCache(config=self.model.config)
        else:
            self.model.set_attn_implementation("gqa")
            self.cache = gt.Cache(self.model, cache, max_length=T, set_attention=False)
        with torch.no_grad():
            self.model(ids[:, :T - 1], cache=self.cache, use_cache=True)
        self.tok = ids[:, T - 1:T]

    def time_decode_step(self, cache, T):
        import torch
        with torch.no_grad():
            self.model(self.tok, cache=self.cache, use_cache=True)
        self.cache.crop(-1)
