"""The operator's attributes are declared once (gqa._operator.ATTRIBUTES): the class, the
function, their signatures and the README's table follow that table."""
import inspect
import pathlib
import re

import numpy as np
import pytest

import gqa
from gqa._operator import ATTRIBUTES

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_table_is_the_attribute_table():
    rows = re.findall(r"^\s*\| `(\w+)` \| (required|`[^`]*`) \|", README.read_text(), re.M)
    table = {name: d for name, d in rows if name in {a.name for a in ATTRIBUTES} or d == "required"}
    want = {a.name: "required" if a.default is inspect.Parameter.empty else f"`{a.default!r}`"
            for a in ATTRIBUTES}
    assert table == want


def test_signatures_follow_the_table():
    names = [a.name for a in ATTRIBUTES]
    cls = list(inspect.signature(gqa.GroupQueryAttention).parameters)
    fn = inspect.signature(gqa.group_query_attention).parameters
    assert cls == names
    assert all(fn[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names)
    assert list(fn)[:2] == ["query", "key"] and "num_threads" in fn
    op = gqa.GroupQueryAttention(num_heads=4, kv_num_heads=2, softcap=1.5)
    assert op.attributes()["softcap"] == 1.5 and set(op.attributes()) == set(names)
    assert repr(op) == "GroupQueryAttention(num_heads=4, kv_num_heads=2, softcap=1.5)"


def test_the_function_keeps_operators_by_exact_attribute_types():
    """True and 1.0 are not the int 1: the function refuses them as the class does, even
    after a call with 1 kept an operator."""
    q = np.ones((1, 1, 4 * 8), np.float32)
    kv = np.ones((1, 1, 2 * 8), np.float32)
    args = (q, kv, kv)
    kw = dict(seqlens_k=np.zeros(1, np.int32), total_sequence_length=1, num_heads=4, kv_num_heads=2)
    gqa.group_query_attention(*args, **kw, causal=1)
    with pytest.raises(TypeError, match="causal must be an int"):
        gqa.group_query_attention(*args, **kw, causal=True)
    with pytest.raises(TypeError, match="causal must be an int"):
        gqa.group_query_attention(*args, **kw, causal=1.0)
    with pytest.raises(TypeError, match="unexpected attribute 'casual'"):
        gqa.group_query_attention(*args, **kw, casual=1)


def test_the_function_takes_the_operator_calls_inputs():
    """gqa/_function.pyx writes op_call's inputs and keywords again (compiled): the same names,
    order, kinds and defaults."""
    from gqa import _function, _signature
    call = list(inspect.signature(_signature.op_call).parameters.values())[1:]
    f = _function.group_query_attention            # its own parameters (__signature__ adds the attributes)
    code = f.__code__
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    assert list(names) == [p.name for p in call]
    assert code.co_argcount == sum(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in call)
    assert f.__kwdefaults__ == {p.name: p.default for p in call if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert all(p.default is None for p in call[1:])
    op = gqa.MixedPrecisionGroupQueryAttention(num_heads=2, kv_num_heads=1)
    assert op.k_format.grouped and op.kv_cache_bit_width == 2
