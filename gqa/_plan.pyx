# cython: language_level=3
"""The decode plan: flash tile sizes and the split of decode work of one call."""
from gqa import _config, _dispatch

cdef dict _SETTINGS = _config._settings   # updated in place by gqa.config
cdef size_t _L2 = _dispatch.l2_cache_bytes() or 512 * 1024   # unknown: assume a small (Zen 3) L2
cdef int _CPUS = _config.PLAN_CPUS       # CPUs this process may run on (affinity mask)
cdef int _UNITS = max(8, _CPUS)


cdef void _plan(int B, int S, int Nkv, int G, int H, int Tmax, int tile_rows, int *q_block,
                int *kv_block, int *splits, int *ranges):
    """Tile sizes of the flash path and the split of decode work (see _attention.run: the
    (batch, KV head) units form `ranges` contiguous ranges and the last unit of each range is
    cut into `splits` key chunks).  They depend on the shapes, the L2 size and the CPU count
    only -- never on the thread count -- so results do not either.
    K and V tiles (2 x kv_rows x H float32) take about 1/8 of L2; a query tile holds
    ~128 rows (query rows x G heads) so each dequantized K/V element is reused 128 times.
    Where the tiles' GEMMs run on bfloat16 tiles, tile_rows (> 0: the tiles' own `rows`,
    256 on AMX, 512 on AVX-512 BF16) rows, since packing each K/V tile costs as much as many
    rows of its GEMMs, and K/V tiles of twice the keys (bfloat16 pairs: half the bytes)."""
    cdef int units = B * Nkv
    blocks = _SETTINGS["flash_blocks"]
    if blocks is not None:
        q_block[0], kv_block[0] = blocks
    else:
        kv_block[0] = max(16, min(256, <int>(_L2 // ((32 if tile_rows else 64) * H))))
        q_block[0] = max(4, (tile_rows if tile_rows else 128) // G)
    sp = _SETTINGS["decode_splits"]
    splits[0] = 1
    ranges[0] = units
    if sp is not None:
        splits[0] = sp
    elif S == 1 and 0 < units < _UNITS:
        # fewer units than max(8, CPUs) leave cores idle or unevenly loaded: split every
        # unit's keys so there are that many pieces, in chunks of >= 256 keys (no units, an
        # empty batch: nothing to split)
        splits[0] = max(1, min(-(-_UNITS // units), Tmax // 256))
    elif S == 1 and units >= 2 * _CPUS:
        # one range per CPU, and each range's last unit in up to 4 chunks of >= 512 keys:
        # whole units keep their cache rows in one core's L2 from call to call, and the
        # chunks let the cores finish together when one runs slower (shared machines)
        splits[0] = max(1, min(4, Tmax // 512))
        ranges[0] = _CPUS


def flash_plan(int B, int S, int Nkv, int G, int H, int Tmax, int tile_rows=0):
    """(q_block, kv_block, splits, ranges) of a call: see _plan."""
    cdef int q_block, kv_block, splits, ranges
    _plan(B, S, Nkv, G, H, Tmax, tile_rows, &q_block, &kv_block, &splits, &ranges)
    return q_block, kv_block, splits, ranges
