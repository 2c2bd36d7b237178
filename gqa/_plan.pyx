# cython: language_level=3
"""The decode plan: flash tile sizes and the split of decode work of one call."""
from gqa import _config, _dispatch
from gqa._dispatch cimport GQA_F32, GQA_F16, GQA_IS_GROUP

cdef dict _SETTINGS = _config._settings   # updated in place by gqa.config
cdef size_t _L2 = _dispatch.l2_cache_bytes() or 512 * 1024   # unknown: assume a small (Zen 3) L2
cdef int _CPUS = _config.PLAN_CPUS       # CPUs this process may run on (affinity mask)
cdef int _UNITS = max(8, _CPUS)
cdef int DIRECT_KEYS = 256    # keys per block of attend_direct (its scores: rows x 256 floats)


cdef int _direct_rows(int type, int level, int H, bint few_units) noexcept nogil:
    """Query rows up to which the decode kernels on `type` beat the flash path's float tiles
    (each K / V tile dequantized once, then float32 GEMMs), from steps of 2-16 tokens at
    T = 8192 (AMD EPYC Zen 3, AVX2; the float tiles' GEMMs are float32 there as on every CPU
    without matrix tiles).  Static INT8 / INT4 codes and float rows: the decode kernels sum
    each score across the head, a cost per score the tiles' GEMMs do not have, so their limit
    grows with H (level 4's integer dots go further); with fewer units than the plan's
    max(8, CPUs) they also get key chunks (splits) the tiles lack, which doubles it.
    Per-group codes: level at 8 rows whatever the head (16 on level 4's integer dots)."""
    cdef int base
    if GQA_IS_GROUP(type):
        return 16 if level >= 4 else 8
    if type == GQA_F32 or type == GQA_F16:
        base = 16
    else:
        base = 64 if level >= 4 else 24
    base = max(4, base * H // 128)
    return 2 * base if few_units else base


cdef int direct_rows(int ktype, int vtype, int level, int H, int units) noexcept nogil:
    cdef bint few = units < _UNITS
    return min(_direct_rows(ktype, level, H, few), _direct_rows(vtype, level, H, few))


def direct_row_limit(int ktype, int vtype, int level, int H, int units):
    """direct_rows (for the tests)."""
    return direct_rows(ktype, vtype, level, H, units)


cdef int step_rows(int ktype, int vtype, int level, int H, int units, int tiles) noexcept nogil:
    """Query rows up to which a multi-token step runs on the decode kernels (_plan's row_limit),
    `tiles` as _dispatch.tile_steps gives them: 1, tiles that take every step (AMX, BFDOT: not
    timed against the decode kernels), none; else direct_rows.  On AVX-512 BF16 tiles (2,
    steps_direct) the level's own limit at level 4 too: between level 3's limit and level 4's
    the integer decode kernels measured faster than the bfloat16 tiles in 57 of 63 cases, 1.42x
    at the median and up to 2.8x (every per-group case, 1.18-2.8x), 1.02-1.22x slower in 6 (static
    codes, H = 64, 2-4 units, 45-64 rows) (AMD EPYC Zen 4, T = 8192, the six shapes of bench
    --shape real, INT8 / INT4 per tensor and per group; within level 3's limit, at levels 3 and
    4, they were faster in 62 of 68 cases, up to 3.8x)."""
    return 0 if tiles == 1 else direct_rows(ktype, vtype, level, H, units)


def step_row_limit(int ktype, int vtype, int level, int H, int units, int tiles):
    """step_rows (for the tests)."""
    return step_rows(ktype, vtype, level, H, units, tiles)


cdef int even_splits(int units, int most) noexcept nogil:
    """Key chunks per unit when 0 < units < max(8, CPUs): at least s0 = ceil(max(8, CPUs) /
    units) and at most 2 s0, the count whose units x chunks pieces share out most evenly over
    the CPUs (pieces / (CPUs x ceil(pieces / CPUs)); the fewest chunks on a tie), each chunk of
    >= 256 keys (at most `most` = Tmax // 256 chunks; at least 1).  On 2 CPUs 3 units take 4
    chunks: 12 pieces, 6 a CPU (3 chunks: 9 pieces, 5 and 4 a CPU)."""
    cdef int s0 = (_UNITS + units - 1) // units, top, s, best = 1
    cdef long long n, rounds, best_n = 0, best_rounds = 1
    if most < 1:
        return 1
    if s0 > most:
        s0 = most
    top = 2 * s0 if 2 * s0 < most else most
    for s in range(s0, top + 1):
        n = <long long>units * s
        rounds = (n + _CPUS - 1) // _CPUS
        if n * best_rounds > best_n * rounds:      # n / rounds above best_n / best_rounds
            best, best_n, best_rounds = s, n, rounds
    return best


cdef void _plan(int B, int S, int Nkv, int G, int H, int Tmax, int tile_rows, bint code_tiles, int row_limit,
                int *q_block, int *kv_block, int *splits, int *ranges, bint *direct):
    """Tile sizes of the flash path and the split of decode work (see _attention.run: the
    (batch, KV head) units form `ranges` contiguous ranges and the last unit of each range is
    cut into `splits` key chunks).  They depend on the shapes, the L2 size and the CPU count
    only -- never on the thread count -- so results do not either.
    K and V tiles (2 x kv_rows x H float32) take about 1/8 of L2; a query tile holds
    ~128 rows (query rows x G heads) so each dequantized K/V element is reused 128 times.
    Where the tiles' GEMMs run on bfloat16 tiles, tile_rows (> 0: the tiles' own `rows`,
    256 on AMX, 512 on AVX-512 BF16) rows, since packing each K/V tile costs as much as many
    rows of its GEMMs, and K/V tiles of twice the keys (bfloat16 pairs: half the bytes).
    `code_tiles` (prompt_qk_kernel: avx2 at level 4 on INT8 / INT4 and per-group codes):
    float32 tiles whose GEMMs read K's and V's codes (no float32 tile) of DIRECT_KEYS keys, over
    which each tile's per-row work (the query and probability rows' codes, the output's finish)
    is spread (Zen 3, S = 1024, one thread: 58 ms against 67 ms with 128 keys, 71 ms with 64).
    `direct`: a multi-token step of S x G <= row_limit rows (step_rows: the cache's and the
    tiles') is one query tile of all S rows on the decode kernels (attend_direct), its
    keys in blocks of DIRECT_KEYS (flash_blocks' key rows where set) and, as a decode step's,
    in `splits` chunks where the units are fewer than max(8, CPUs)."""
    cdef int units = B * Nkv
    blocks = _SETTINGS["flash_blocks"]
    if blocks is not None:
        q_block[0], kv_block[0] = blocks
    else:
        kv_block[0] = (DIRECT_KEYS if code_tiles else
                       max(16, min(256, <int>(_L2 // ((32 if tile_rows else 64) * H)))))
        q_block[0] = max(4, (tile_rows if tile_rows else 128) // G)
    direct[0] = S > 1 and <long long>S * G <= row_limit
    if direct[0]:
        q_block[0] = S
        kv_block[0] = blocks[1] if blocks is not None else DIRECT_KEYS
    sp = _SETTINGS["decode_splits"]
    splits[0] = 1
    ranges[0] = units
    if sp is not None:
        splits[0] = sp
    elif (S == 1 or direct[0]) and 0 < units < _UNITS:
        # fewer units than max(8, CPUs) leave cores idle or unevenly loaded: split every
        # unit's keys (no units, an empty batch: nothing to split)
        splits[0] = even_splits(units, Tmax // 256)
    elif S == 1 and units >= 2 * _CPUS:
        # one range per CPU, and each range's last unit in up to 4 chunks of >= 512 keys:
        # whole units keep their cache rows in one core's L2 from call to call, and the
        # chunks let the cores finish together when one runs slower (shared machines)
        splits[0] = max(1, min(4, Tmax // 512))
        ranges[0] = _CPUS


def flash_plan(int B, int S, int Nkv, int G, int H, int Tmax, int tile_rows=0, int row_limit=0,
               bint code_tiles=False):
    """(q_block, kv_block, splits, ranges, direct) of a call: see _plan."""
    cdef int q_block, kv_block, splits, ranges
    cdef bint direct
    _plan(B, S, Nkv, G, H, Tmax, tile_rows, code_tiles, row_limit, &q_block, &kv_block, &splits, &ranges,
          &direct)
    return q_block, kv_block, splits, ranges, direct
