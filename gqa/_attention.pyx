# cython: language_level=3
"""GroupQueryAttention compute (placeholder; filled by the operator)."""
