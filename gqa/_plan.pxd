# The decode plan of a call (see _plan.pyx), for gqa/_signature.pyx.
cdef void _plan(int B, int S, int Nkv, int G, int H, int Tmax, int tile_rows, bint code_tiles, int row_limit,
                int *q_block, int *kv_block, int *splits, int *ranges, bint *direct)
# Query rows up to which a multi-token step on these K / V cache types at accuracy `level`,
# heads of H columns and `units` (batch, KV head) pairs beats float32 tiles on the decode kernels.
cdef int direct_rows(int ktype, int vtype, int level, int H, int units) noexcept nogil
# _plan's row_limit: direct_rows with the matrix tiles' rule (`tiles` as _dispatch.tile_steps).
cdef int step_rows(int ktype, int vtype, int level, int H, int units, int tiles) noexcept nogil
