"""The real model's loop: SmolLM2-135M-Instruct through gqa (the demo extra, or GQA_GGUF naming
a Llama-family GGUF file in the benchmark environment; skipped otherwise).

- ``ModelPerplexity.track_ppl_gap``: perplexity of each quantized cache relative to the float
  cache, in percent, over the first 513 tokens of the evaluation text with scales calibrated
  on 512 tokens of the calibration text (gqa/apps/texts.py, gqa/apps/eval.py's procedure).
- ``ModelDecode.time_decode_step``: one whole decode step (30 layers: NumPy projections and
  MLP, gqa attention, logits) at total length T, the cache holding T - 1 positions of the
  evaluation text, rolled back after each step.
"""
import timeit

import numpy as np

from .common import gqa  # noqa: F401  (the gqa under test: source tree or installed)

_MODEL = []


def _model():
    from gqa.apps import gguf as _gguf
    if not _gguf.available():
        raise NotImplementedError(f"the real model is not installed: {_gguf.INSTALL_HINT}")
    if not _MODEL:
        from gqa.apps.llama import Llama
        _MODEL.append(Llama.load())
    return _MODEL[0]


QUANT_MODES = ["int8-pt", "int8-pc", "int8-pc/pt", "int4-pt", "int4-pc/pt", "int4-pc"]


class ModelPerplexity:
    params = [QUANT_MODES]
    param_names = ["mode"]
    timeout = 900
    unit = "%"

    def setup_cache(self):
        try:
            model = _model()
        except NotImplementedError:
            return None
        from gqa.apps import eval as _eval, texts as _texts
        ev = np.array(model.encode(_texts.evaluation_text()))[:513]
        cal = model.calibration(model.encode(_texts.calibration_text())[:512])
        r = _eval.perplexities(model, ev, cal, QUANT_MODES)
        return {m: 100.0 * v["rel_change"] for m, v in r.items()}

    def setup(self, gaps, mode):
        if gaps is None:
            _model()    # raises NotImplementedError with the reason

    def track_ppl_gap(self, gaps, mode):
        return gaps[mode]
    track_ppl_gap.unit = "%"


class ModelDecode:
    params = [["float", "int8-pt", "int8-pc/pt", "int4-pc/pt"], [512, 2048]]
    param_names = ["mode", "T"]
    timer = timeit.default_timer
    timeout = 600
    number = 3
    repeat = (2, 5, 20.0)

    def setup(self, mode, T):
        from gqa.apps import texts as _texts
        self.model = model = _model()
        ids = np.array(model.encode(_texts.evaluation_text()))[:T]
        src = model.new_cache(T - 1)
        for pos in range(0, T - 1, 512):
            model.forward(ids[None, pos:min(pos + 512, T - 1)], src)
        if mode == "float":
            self.cache = model.new_cache(T)
        else:
            self.cache = model.new_cache(T, mode, calibration=src.calibration())
        self.cache.copy_from(src)
        self.tok = ids[None, T - 1:T]
        self.T = T

    def time_decode_step(self, mode, T):
        self.cache.truncate(T - 1)
        self.model.logits(self.model.forward(self.tok, self.cache)[0, -1])
