# cython: language_level=3
"""The functional forms: ``gqa.group_query_attention`` and
``gqa.mixed_precision_group_query_attention``.  Each keeps the operator of each set of
attributes (gqa/_operator.py) and calls it; compiled, so a loop that calls the function per
layer and step pays what a kept operator pays.  The inputs and call keywords are op_call's
(gqa/_signature.pyx; tests/test_attributes.py checks that the two agree), every other
keyword is an attribute."""
from gqa._operator import (GroupQueryAttention, MIXED_FIXED, format_version,
                           function_signature)
from gqa._signature cimport call_op

cdef dict _OPS = {}          # (names, values, their types) of the attributes -> kept operator
cdef int MAX_OPERATORS = 64


cdef object _kept_operator(dict attributes):
    """The kept operator of these attributes (validated when first made); the values' exact
    types are in the key, so True or 1.0 do not find the operator of 1."""
    cdef tuple values = tuple(attributes.values())
    cdef tuple key = (tuple(attributes), values, tuple(map(type, values)))
    try:
        op = _OPS.get(key)
    except TypeError:            # an unhashable value: made (and refused or taken), not kept
        return GroupQueryAttention(**attributes)
    if op is None:
        op = GroupQueryAttention(**attributes)
        if len(_OPS) >= MAX_OPERATORS:
            _OPS.clear()
        _OPS[key] = op
    return op


def group_query_attention(query, key=None, value=None, past_key=None, past_value=None,
                          seqlens_k=None, total_sequence_length=None, cos_cache=None,
                          sin_cache=None, position_ids=None, attention_bias=None, head_sink=None,
                          k_scale=None, v_scale=None, q_norm_weight=None, k_norm_weight=None,
                          past_hp_key=None, past_hp_value=None, oscar_rotation_k=None,
                          oscar_rotation_v=None, *, present_key=None, present_value=None,
                          present_hp_key=None, present_hp_value=None, num_threads=None,
                          **attributes):
    """Functional form of :class:`GroupQueryAttention`: inputs in ONNX order and names (also
    as keywords), attributes as keywords.  The operator of each set of attributes is made
    once and kept (up to 64 sets), so a loop that calls this function per layer and step pays
    what a kept operator pays."""
    return call_op(_kept_operator(attributes), query, key, value, past_key, past_value,
                   seqlens_k, total_sequence_length, cos_cache, sin_cache, position_ids,
                   attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight,
                   past_hp_key, past_hp_value, oscar_rotation_k, oscar_rotation_v, present_key,
                   present_value, present_hp_key, present_hp_value, num_threads)


def mixed_precision_group_query_attention(*inputs, kv_cache_bit_width=2, cache_format_version=1,
                                          **keywords):
    """Functional form of :class:`MixedPrecisionGroupQueryAttention` (inputs in ONNX order and
    names, attributes as keywords): the kept PER_GROUP operator of the function
    ``group_query_attention``, so a loop pays what a kept operator pays."""
    for name in MIXED_FIXED:
        if name in keywords:
            raise TypeError(f"mixed_precision_group_query_attention has no {name}: its caches are "
                            "PER_GROUP")
    format_version(cache_format_version)
    return group_query_attention(*inputs, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
                                 kv_cache_bit_width=kv_cache_bit_width, **keywords)


group_query_attention.__signature__ = function_signature()
