"""gqa: Group Query Attention over an INT8/INT4 quantized KV cache, on CPU.

Re-implements ONNX Runtime's ``com.microsoft.GroupQueryAttention`` (CPU, with
its quantized KV cache) with per-ISA kernels chosen at runtime.
"""
from ._version import __version__
from ._config import (active_kernel, available_kernels, config, get_config)
from ._api import dequantize, qk_gemm, quantize, sv_gemm
from ._show import show_config
from ._operator import GroupQueryAttention, group_query_attention

__all__ = [
    "__version__", "config", "get_config", "available_kernels", "active_kernel", "show_config",
    "quantize", "dequantize", "qk_gemm", "sv_gemm", "GroupQueryAttention", "group_query_attention",
]
