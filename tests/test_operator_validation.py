"""Every rejected call raises ValueError/TypeError naming the argument, before any caller
buffer is written."""
import numpy as np
import pytest

import gqa
from _cases import make_case


def base(**kw):
    args = dict(B=2, S=1, past=6, N=4, Nkv=2, H=16, mode="PER_TENSOR", bits=8, ragged=[3, 7], buf=8)
    args.update(kw)
    return make_case(seed=21, **args)


def mutate(name):
    """(inputs, attrs, extra call kwargs) for one invalid call."""
    inp, a = base()
    kw = {}
    if name == "query_dtype":
        inp["query"] = inp["query"].astype(np.float64)
    elif name == "query_rank":
        inp["query"] = inp["query"][0]
    elif name == "query_hidden":
        inp["query"] = inp["query"][..., :-1]
    elif name == "key_dtype":
        inp["key"] = inp["key"].astype(np.float16)
    elif name == "key_batch":
        inp["key"] = inp["key"][:1]
    elif name == "key_hidden":
        inp["key"] = inp["key"][..., :-8]
    elif name == "value_missing":
        inp["value"] = None
    elif name == "kv_seq_mismatch":
        inp["value"] = np.concatenate([inp["value"], inp["value"]], 1)
    elif name == "head_size_not_mult8":
        inp, a = base(H=12)
    elif name == "heads_not_multiple":
        a["kv_num_heads"] = 3
    elif name == "past_dtype":
        inp["past_key"] = inp["past_key"].astype(np.uint8)
    elif name == "past_rank":
        inp["past_key"] = inp["past_key"][0]
    elif name == "past_heads":
        inp["past_key"] = inp["past_key"][:, :1]
        inp["past_value"] = inp["past_value"][:, :1]
    elif name == "past_width":
        inp["past_key"] = np.zeros(inp["past_key"].shape[:3] + (8,), np.int8)
    elif name == "past_only_key":
        inp["past_value"] = None
    elif name == "past_shape_mismatch":
        inp["past_value"] = inp["past_value"][:, :, :5]
    elif name == "seqlens_dtype":
        inp["seqlens_k"] = inp["seqlens_k"].astype(np.int64)
    elif name == "seqlens_shape":
        inp["seqlens_k"] = inp["seqlens_k"][:1]
    elif name == "seqlens_negative":
        inp["seqlens_k"] = np.array([-1, 6], np.int32)
    elif name == "seqlens_beyond_buffer":
        inp["seqlens_k"] = np.array([2, 9], np.int32)
        inp["total_sequence_length"] = 9
    elif name == "seqlens_beyond_total":
        inp["total_sequence_length"] = 5
    elif name == "seqlens_needs_more_past":
        inp["past_key"] = inp["past_key"][:, :, :4]
        inp["past_value"] = inp["past_value"][:, :, :4]
    elif name == "total_dtype":
        inp["total_sequence_length"] = np.array([7], np.int64)
    elif name == "total_size":
        inp["total_sequence_length"] = np.array([7, 7], np.int32)
    elif name == "total_zero":
        inp["total_sequence_length"] = 0
    elif name == "k_scale_missing":
        inp["k_scale"] = None
    elif name == "k_scale_dtype":
        inp["k_scale"] = inp["k_scale"].astype(np.float64)
    elif name == "v_scale_size":
        inp["v_scale"] = np.ones(3, np.float32)
    elif name == "scale_with_float_cache":
        inp, a = base(mode="NONE")
        inp["k_scale"] = np.ones(1, np.float32)
    elif name == "quant_type_bad":
        a["k_quant_type"] = "PER_GROUP"
    elif name == "bits_bad":
        a["kv_cache_bit_width"] = 6
    elif name == "bits_without_quant":
        inp, a = base(mode="NONE")
        a["kv_cache_bit_width"] = 8
    elif name == "kv_mode_none_mixed":
        a["v_quant_type"] = "NONE"
    elif name == "cache_dtype_for_int4":
        a["kv_cache_bit_width"] = 4
    elif name == "bias_shape":
        inp["attention_bias"] = np.zeros((2, 4, 1, 6), np.float32)
    elif name == "bias_dtype":
        inp["attention_bias"] = np.zeros((2, 4, 1, 7), np.float16)
    elif name == "sink_shape":
        inp["head_sink"] = np.zeros(3, np.float32)
    elif name == "rotary_without_caches":
        a["do_rotary"] = 1
    elif name == "cos_only":
        inp, a = base(rotary=True)
        inp["sin_cache"] = None
    elif name == "cos_too_short":
        inp, a = base(rotary=True)
        inp["cos_cache"] = inp["cos_cache"][:5]
        inp["sin_cache"] = inp["sin_cache"][:5]
    elif name == "cos_too_wide":
        inp, a = base(rotary=True)
        inp["cos_cache"] = np.concatenate([inp["cos_cache"]] * 2, 1)
        inp["sin_cache"] = np.concatenate([inp["sin_cache"]] * 2, 1)
    elif name == "position_ids_oob":
        inp, a = base(rotary=True, pos_ids=True)
        inp["position_ids"] = inp["position_ids"] + 100
    elif name == "position_ids_dtype":
        inp, a = base(rotary=True, pos_ids=True)
        inp["position_ids"] = inp["position_ids"].astype(np.int32)
    elif name == "qk_output_bad":
        a["qk_output"] = 3
    elif name == "window_with_noncausal":
        a.update(causal=0, local_window_size=2)
    elif name == "softcap_negative":
        a["softcap"] = -1.0
    elif name == "softcap_inf":
        a["softcap"] = float("inf")
    elif name == "scale_nan":
        a["scale"] = float("nan")
    elif name == "scale_inf":
        a["scale"] = -float("inf")
    elif name == "do_rotary_2":
        a["do_rotary"] = 2
    elif name == "interleaved_2":
        a["rotary_interleaved"] = 2
    elif name == "smooth_softmax_2":
        a["smooth_softmax"] = 2
    elif name == "num_heads_zero":
        a["num_heads"] = 0
    elif name == "multi_token_batch_with_past":
        inp, a = base(S=2)
    elif name == "present_wrong_dtype":
        kw = dict(present_key=np.zeros((2, 2, 8, 16), np.uint8), present_value=np.zeros((2, 2, 8, 16), np.int8))
    elif name == "present_wrong_shape":
        kw = dict(present_key=np.zeros((2, 2, 7, 16), np.int8), present_value=np.zeros((2, 2, 7, 16), np.int8))
    elif name == "present_only_key":
        kw = dict(present_key=np.zeros((2, 2, 8, 16), np.int8))
    elif name == "present_readonly":
        pk = np.zeros((2, 2, 8, 16), np.int8)
        pk.flags.writeable = False
        kw = dict(present_key=pk, present_value=np.zeros((2, 2, 8, 16), np.int8))
    elif name == "present_aliases_input":
        kw = dict(present_key=inp["past_value"], present_value=np.zeros((2, 2, 8, 16), np.int8))
    elif name == "inplace_only_key":
        kw = dict(present_key=inp["past_key"], present_value=np.zeros((2, 2, 8, 16), np.int8))
    elif name == "inplace_buffer_too_short":
        inp["total_sequence_length"] = 9
        inp["seqlens_k"] = np.array([2, 8], np.int32)
        kw = dict(present_key=inp["past_key"], present_value=inp["past_value"])
    elif name == "threads_zero":
        kw = dict(num_threads=0)
    else:
        raise KeyError(name)
    return inp, a, kw


CASES = {  # name -> (exception, words the message must contain)
    "query_dtype": (TypeError, "query"), "query_rank": (ValueError, "query"),
    "query_hidden": (ValueError, "num_heads"), "key_dtype": (TypeError, "key"),
    "key_batch": (ValueError, "key"), "key_hidden": (ValueError, "key"),
    "value_missing": (ValueError, "value"), "kv_seq_mismatch": (ValueError, "value"),
    "head_size_not_mult8": (ValueError, "head_size"), "heads_not_multiple": (ValueError, "kv_num_heads"),
    "past_dtype": (TypeError, "past_key"), "past_rank": (ValueError, "past_key"),
    "past_heads": (ValueError, "past_key"), "past_width": (ValueError, "past_key"),
    "past_only_key": (ValueError, "past_value"), "past_shape_mismatch": (ValueError, "past_value"),
    "seqlens_dtype": (TypeError, "seqlens_k"), "seqlens_shape": (ValueError, "seqlens_k"),
    "seqlens_negative": (ValueError, "seqlens_k[0]"), "seqlens_beyond_buffer": (ValueError, "seqlens_k[1]"),
    "seqlens_beyond_total": (ValueError, "seqlens_k[1]"), "seqlens_needs_more_past": (ValueError, "past"),
    "total_dtype": (TypeError, "total_sequence_length"), "total_size": (ValueError, "total_sequence_length"),
    "total_zero": (ValueError, "total_sequence_length"), "k_scale_missing": (ValueError, "k_scale"),
    "k_scale_dtype": (TypeError, "k_scale"), "v_scale_size": (ValueError, "v_scale"),
    "scale_with_float_cache": (ValueError, "k_scale"), "quant_type_bad": (ValueError, "k_quant_type"),
    "bits_bad": (ValueError, "kv_cache_bit_width"), "bits_without_quant": (ValueError, "kv_cache_bit_width"),
    "kv_mode_none_mixed": (ValueError, "v_quant_type"), "cache_dtype_for_int4": (TypeError, "past_key"),
    "bias_shape": (ValueError, "attention_bias"), "bias_dtype": (TypeError, "attention_bias"),
    "sink_shape": (ValueError, "head_sink"), "rotary_without_caches": (ValueError, "cos_cache"),
    "cos_only": (ValueError, "sin_cache"), "cos_too_short": (ValueError, "cos_cache"),
    "cos_too_wide": (ValueError, "cos_cache"), "position_ids_oob": (ValueError, "position_ids"),
    "position_ids_dtype": (TypeError, "position_ids"), "qk_output_bad": (ValueError, "qk_output"),
    "window_with_noncausal": (ValueError, "local_window_size"), "softcap_negative": (ValueError, "softcap"),
    "softcap_inf": (ValueError, "softcap"), "scale_nan": (ValueError, "scale"),
    "scale_inf": (ValueError, "scale"), "do_rotary_2": (ValueError, "do_rotary"),
    "interleaved_2": (ValueError, "rotary_interleaved"), "smooth_softmax_2": (ValueError, "smooth_softmax"),
    "num_heads_zero": (ValueError, "num_heads"), "multi_token_batch_with_past": (ValueError, "batch_size"),
    "present_wrong_dtype": (TypeError, "present_key"), "present_wrong_shape": (ValueError, "present_key"),
    "present_only_key": (ValueError, "present_value"), "present_readonly": (ValueError, "present_key"),
    "present_aliases_input": (ValueError, "present_key"), "inplace_only_key": (ValueError, "in-place"),
    "inplace_buffer_too_short": (ValueError, "total_sequence_length"), "threads_zero": (ValueError, "num_threads"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_invalid_call_raises_and_touches_nothing(name):
    exc, words = CASES[name]
    inp, a, kw = mutate(name)
    arrays = [x for x in list(inp.values()) + list(kw.values()) if isinstance(x, np.ndarray)]
    before = [x.copy() for x in arrays]
    with pytest.raises(exc) as info:
        gqa.group_query_attention(**inp, **a, **kw)
    assert words in str(info.value), str(info.value)
    for x, old in zip(arrays, before):
        assert np.array_equal(x.view(np.uint8), old.view(np.uint8)), "a caller buffer was modified"


def test_valid_base_call_succeeds():
    """The unmutated base call is valid, so each failure above is due to its mutation."""
    inp, a, _ = mutate("threads_zero")
    out = gqa.group_query_attention(**inp, **a)
    assert out[0].shape == (2, 1, 64) and np.isfinite(out[0]).all()


def test_attributes_checked_at_construction():
    with pytest.raises(ValueError, match="kv_cache_bit_width"):
        gqa.GroupQueryAttention(num_heads=4, kv_num_heads=2, k_quant_type="per_tensor",
                                v_quant_type="per_tensor", kv_cache_bit_width=0)
    with pytest.raises(TypeError, match="num_heads"):
        gqa.GroupQueryAttention(num_heads="4", kv_num_heads=2)
    op = gqa.GroupQueryAttention(num_heads=4, kv_num_heads=2, k_quant_type="per_channel",
                                 v_quant_type="Per_Tensor", kv_cache_bit_width=4)
    assert (op.k_quant_type, op.v_quant_type) == ("PER_CHANNEL", "PER_TENSOR")


def test_repeated_calls_recheck_what_can_change():
    """A GroupQueryAttention object reuses its shape checks across calls with the same input
    signature; everything that can change between calls is still checked every time."""
    inp, a = base(buf=8)
    op = gqa.GroupQueryAttention(**a)
    pk, pv = inp["past_key"], inp["past_value"]
    args = dict(inp, present_key=pk, present_value=pv)
    op(**args)                                            # in place, signature cached
    with pytest.raises(ValueError, match=r"seqlens_k\[1\]"):   # values: beyond T
        op(**dict(args, seqlens_k=np.array([2, 7], np.int32), total_sequence_length=7))
    with pytest.raises(ValueError, match="total_sequence_length"):
        op(**dict(args, total_sequence_length=9, seqlens_k=np.array([2, 7], np.int32)))
    before = pk.copy()
    pk.flags.writeable = False                            # same object, now read-only
    with pytest.raises(ValueError, match="past_key"):
        op(**args)
    assert np.array_equal(pk, before)
    pk.flags.writeable = True
    with pytest.raises(ValueError, match="query"):        # new shape -> full checks again
        op(**dict(args, query=np.zeros((2, 1, 65), np.float32)))
    with pytest.raises(TypeError, match="query"):         # not an ndarray
        op(**dict(args, query=inp["query"].tolist()))
    out = op(**args)[0]                                   # and the valid call still works
    assert np.isfinite(out).all()


def test_inplace_inputs_aliasing_the_cache_are_rejected_every_call():
    """In-place mode writes the cache before reading the inputs; an input living inside the
    cache is refused (a seqlens_k there could otherwise steer writes out of bounds)."""
    inp, a = base(mode="NONE", buf=8)
    op = gqa.GroupQueryAttention(**a)
    pk, pv = inp["past_key"], inp["past_value"]
    args = dict(inp, present_key=pk, present_value=pv)
    op(**args)                                              # cache the signature
    alias = pk.reshape(-1)[:2].view(np.int32)               # seqlens_k inside past_key
    alias[:] = inp["seqlens_k"]
    before = pk.copy()
    with pytest.raises(ValueError, match="seqlens_k"):
        op(**dict(args, seqlens_k=alias))
    assert np.array_equal(pk.view(np.uint8), before.view(np.uint8))
    q_alias = pv.reshape(-1)[:inp["query"].size].reshape(inp["query"].shape)
    with pytest.raises(ValueError, match="query"):
        op(**dict(args, query=q_alias))
