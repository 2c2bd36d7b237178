"""onnxruntime as a peer and as the test oracle: a one-node com.microsoft.GroupQueryAttention graph.

Used by the test suite (``tests/_ort.py`` re-exports these names) and by ``python -m gqa bench``.
onnxruntime and onnx are optional: without them :func:`available` is False and nothing else
here may be called.

`run_ort(inputs, attrs)` takes the same names as gqa.group_query_attention and returns
onnxruntime's outputs; `OrtInPlace` runs steps with past and present bound to the same
buffers (IOBinding), the decoding-loop mode; `OrtInPlace.bound(inputs)` binds every input
and output once and returns a callable that only runs ``run_with_iobinding`` (what a
benchmark of the call should time).
"""
import numpy as np

ort = None
onnx = None
helper = None
try:  # the test extra; callers that need it check available() / importable()
    import onnx
    import onnxruntime as ort
    from onnx import helper
except ImportError:  # pragma: no cover
    ort = onnx = helper = None

ORT_VERSION = "1.31.1"

INPUT_NAMES = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
               "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale",
               "v_scale")
ATTRS = ("num_heads", "kv_num_heads", "scale", "softcap", "local_window_size", "causal", "do_rotary",
         "rotary_interleaved", "smooth_softmax", "qk_output", "k_quant_type", "v_quant_type",
         "kv_cache_bit_width")


def importable():
    """onnxruntime and onnx can be imported (any version)."""
    return ort is not None and onnx is not None


def available():
    """onnxruntime ``ORT_VERSION`` (the oracle's version) and onnx are importable."""
    return importable() and ort.__version__ == ORT_VERSION


def _elem(dtype):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


_cache = {}


def session(inputs, attrs, threads=1, config=None):
    """A cached InferenceSession for this signature (names, dtypes, ranks, attrs, threads,
    session config entries such as ``{"session.intra_op.allow_spinning": "0"}``)."""
    present = feeds(inputs)
    config = dict(config or {})
    key = (tuple((n, np.asarray(x).dtype.str, np.asarray(x).ndim) for n, x in present.items()),
           tuple(sorted(attrs.items())), threads, tuple(sorted(config.items())))
    if key in _cache:
        return _cache[key]
    node_inputs = [n if n in present else "" for n in INPUT_NAMES]
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    outs = ["output", "present_key", "present_value"]
    if attrs.get("qk_output", 0):
        outs.append("output_qk")
    node = helper.make_node("GroupQueryAttention", node_inputs, outs, domain="com.microsoft",
                            **{k: v for k, v in attrs.items()})
    g_in = []
    for n, x in present.items():
        x = np.asarray(x)
        shape = [f"{n}_{i}" for i in range(x.ndim)] if n != "total_sequence_length" else [1]
        g_in.append(helper.make_tensor_value_info(n, _elem(x.dtype), shape))
    qdt = _elem(np.asarray(inputs["query"]).dtype)
    cdt = _elem(np.asarray(inputs["past_key"]).dtype) if "past_key" in present else qdt
    g_out = [helper.make_tensor_value_info("output", qdt, None),
             helper.make_tensor_value_info("present_key", cdt, None),
             helper.make_tensor_value_info("present_value", cdt, None)]
    if len(outs) == 4:
        g_out.append(helper.make_tensor_value_info("output_qk", qdt, None))
    graph = helper.make_graph([node], "gqa", g_in, g_out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    _cache[key] = sess
    return sess


def feeds(inputs):
    out = {}
    for n in INPUT_NAMES:
        x = inputs.get(n)
        if x is None:
            continue
        if n == "total_sequence_length":
            x = np.array([x], np.int32) if np.isscalar(x) or isinstance(x, int) else np.asarray(x, np.int32).reshape(1)
        out[n] = x
    return out


def run_ort(inputs, attrs, threads=1):
    sess = session(inputs, attrs, threads)
    return sess.run(None, feeds(inputs))


class OrtInPlace:
    """Steps with onnxruntime's own shared past/present buffers (IOBinding)."""

    def __init__(self, inputs, attrs, past_key, past_value, threads=1):
        self.sess = session(dict(inputs, past_key=past_key, past_value=past_value), attrs, threads)
        self.k = ort.OrtValue.ortvalue_from_numpy(past_key)
        self.v = ort.OrtValue.ortvalue_from_numpy(past_value)

    def _binding(self, inputs, out=None):
        io = self.sess.io_binding()
        for n, x in feeds(inputs).items():
            if n in ("past_key", "past_value"):
                continue
            io.bind_cpu_input(n, x)
        io.bind_ortvalue_input("past_key", self.k)
        io.bind_ortvalue_input("past_value", self.v)
        if out is None:  # "output" first: copy_outputs_to_cpu() follows the binding order
            io.bind_output("output")
        else:
            io.bind_ortvalue_output("output", out)
        io.bind_ortvalue_output("present_key", self.k)
        io.bind_ortvalue_output("present_value", self.v)
        return io

    def step(self, inputs):
        io = self._binding(inputs)
        self.sess.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()[0]

    def bound(self, inputs, out):
        """Bind `inputs` (kept alive by the binding), the caches and a preallocated float
        output array `out` once; return a no-argument callable that runs the node again
        (``run_with_iobinding`` only: onnxruntime's cheapest call)."""
        self._out = ort.OrtValue.ortvalue_from_numpy(out)
        io = self._binding(inputs, self._out)
        sess = self.sess
        self._io = io
        return lambda: sess.run_with_iobinding(io)

    def caches(self):
        return self.k.numpy(), self.v.numpy()
