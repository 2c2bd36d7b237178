# The decode plan of a call (see _plan.pyx), for gqa/_signature.pyx.
cdef void _plan(int B, int S, int Nkv, int G, int H, int Tmax, int tile_rows, int *q_block,
                int *kv_block, int *splits, int *ranges)
