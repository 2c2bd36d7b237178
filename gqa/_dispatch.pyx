# cython: language_level=3
"""Owner of the process-wide kernel table: CPU features, compiled and runnable
paths, the active path and the approximate-VNNI switch.  The Python-facing
policy (env flags, validation messages, context manager) lives in _config.py."""

cdef extern from "gqa_kernels.h" nogil:
    unsigned gqa_cpu_features()
    const char *gqa_cpu_feature_name(unsigned bit_index)
    const char *gqa_path_name(int path)
    const gqa_kernels *gqa_path_table(int path)
    int gqa_path_runnable(int path)
    int gqa_approx_vnni_runnable()
    const gqa_kernels *gqa_s8_dot_table(int path)
    const gqa_tiles *gqa_path_tiles(int path)
    const gqa_tiles *gqa_path_tiles_at(int path, int i)
    int gqa_tiles_runnable(int path, const gqa_tiles *x)
    size_t gqa_l2_cache_bytes()
    int gqa_group_type(int kind, size_t group, int meta16)
    int GQA_PATH_COUNT
    const char *GQA_COMPILED_PATHS
    const char *GQA_COMPILED_UNITS
    const char *GQA_EMULATED_UNITS

cdef extern from "kernels_s8dot_contract.h" nogil:
    bint gqa_dot_codes(int type)   # the types level 4's integer-dot contracts take
    bint gqa_is_group "GQA_IS_GROUP"(int type)
    bint gqa_group_dot_takes(int type, size_t cols)   # ... per group, rows of `cols`
    int DOT_QK_K

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int gqa_openmp_enabled(void) { return 1; }
    static int gqa_openmp_max_threads(void) { return omp_get_max_threads(); }
    #else
    static int gqa_openmp_enabled(void) { return 0; }
    static int gqa_openmp_max_threads(void) { return 1; }
    #endif
    """
    int gqa_openmp_enabled()
    int gqa_openmp_max_threads() nogil

cdef const gqa_kernels *_active = gqa_path_table(0)
cdef const gqa_tiles *_tiles = NULL      # the active path's tiles where this CPU runs them
cdef object _tiles_choice = True         # gqa.config(tiles=...): True (the best), False or a name
cdef bint _approx = False
cdef bint _vnni = gqa_approx_vnni_runnable() == 1     # the CPU (and build) run the VNNI unit
# the table whose level-4 integer dots the active path runs here (gqa_s8_dot_table: the path's
# own, or on avx2 the avxvnni table where the CPU has AVX-VNNI), NULL where none runs
cdef const gqa_kernels *_dotk = gqa_s8_dot_table(0)
# ... and they serve the flash prompt's tiles too.  On avx512 their P @ V of INT8 codes
# (vpdpwssd, 32 products an instruction) beats float32 products on a V tile dequantized once
# (Zen 4: the prompt 1.11-1.16x; INT4 not measured there: float32).  On avx2 (and avxvnni) the
# calls of many rows take the packed kernels (kernels_avx2_pack.h), whose vpmaddwd + vpaddd do 16
# products in two instructions without widening codes per row (Zen 3: 77 G products/s a core
# against the float32 FMA blocks' 46 G), so a tile's scores and its P @ V both run on the codes,
# INT8 and INT4, and per-group codes (_dot_prompt_qk); the decode kernels' 1-4 rows a pass had
# made P @ V 0.91x.
cdef bint _dot_prompt_pv = False
cdef bint _dot_prompt_qk = False
# level 4 on per-group codes (decode steps and the naive path; on avx2 also the prompts' float32
# flash tiles, _prompt_codes; elsewhere those keep float32):
# the level-4 table of the active path (gqa_s8_dot_table: avx512's VNNI unit,
# kernels_avx512vnni_gdot.c; avx2's, kernels_avx2_gdot.c, or avxvnni's with AVX-VNNI; neon's
# sdot unit, kernels_neon_gdot.c), on avx512 without VNNI the avx2 path's (every AVX-512 CPU runs
# it); NULL elsewhere (float32).  _gdot_unit names the unit.
cdef const gqa_kernels *_gdot = NULL
cdef object _gdot_unit = None

cdef int omp_max_threads() noexcept nogil:
    return gqa_openmp_max_threads()

cdef const gqa_kernels *active_table() noexcept nogil:
    return _active

cdef const gqa_tiles *dot_tiles(int type, int level) noexcept nogil:
    if level >= 4 and (type == GQA_S8_PT or type == GQA_S8_PC) and _tiles != NULL and _tiles.qk_s8 != NULL:
        return _tiles
    return NULL


# The fewest query rows per call (a KV head's G, or a step's S x G) that take the bfloat16
# kernels of float rows (gqa_tiles.qk_f / sv_f): with fewer, the step reads its cache faster in
# float32 (Zen 4, T = 8192, 2 threads: the seed shape's 2 rows 0.79x; 3 and 8 rows hot
# 1.3-1.5x, from DRAM 0.96-1.0x at 3-4 rows and 1.2x at 8).
cdef enum: FLOAT_TILE_ROWS = 3


cdef const gqa_tiles *float_tiles(int type, int level, int rows) noexcept nogil:
    if (level >= 3 and type == GQA_F32 and rows >= FLOAT_TILE_ROWS and _tiles != NULL
            and _tiles.qk_f != NULL):
        return _tiles
    return NULL


cdef gqa_qk_gemm_fn qk_kernel(const gqa_kernels *t, int type, int level, bint tiles, int rows) noexcept nogil:
    if tiles and dot_tiles(type, level) != NULL:
        return _tiles.qk_s8
    if tiles and float_tiles(type, level, rows) != NULL:
        return _tiles.qk_f
    if gqa_is_group(type):
        return _gdot.qk_gemm_s8_dot if level >= 4 and tiles and _gdot != NULL else t.qk_gemm
    if not gqa_dot_codes(type):
        return t.qk_gemm
    if level >= 4 and _dotk != NULL:
        return _dotk.qk_gemm_s8_dot
    if _vnni and _approx and type == GQA_S8_PT and t.qk_gemm_s8_approx != NULL:
        return t.qk_gemm_s8_approx
    return t.qk_gemm


cdef bint _prompt_codes(int type, int level, int H) noexcept nogil:
    """The flash prompt's float32 tiles read `type`'s codes at `level` (heads of H columns): the
    avx2 path's packed kernels, INT8 / INT4 per tensor and per channel, and per-group codes the
    per-group contracts take."""
    return level >= 4 and _dot_prompt_qk and (gqa_dot_codes(type) or (
        gqa_is_group(type) and gqa_group_dot_takes(type, H) and H <= DOT_QK_K))


cdef void float_tile_types(int level, int H, int *ktype, int *vtype) noexcept nogil:
    """The codes a float32 cache's K and V tiles take in a flash prompt at `level` (heads of H
    columns), quantized a key tile at a time (attend_tiled's code_tile): where the avx2 path's
    packed kernels run and no matrix tiles do, K as INT8 per channel with a zero per channel
    (the tile's range of each channel in 255 steps; code_rows) and V as INT8 rows of one group
    (the per-group caches' codec; heads over 256 columns: the widest group of a multiple of 32
    that divides them); else -1 and -1.  SmolLM2 (README, top-1 agreement with level 0): K
    without zeros, or per group of 32, 98.6-99.1 %; these 99.5-99.8 %, and V in groups of 32
    had been no closer, and 1.15x slower (seed shape, S = 2048)."""
    cdef int g = 256 if H > 256 else H, g8
    ktype[0] = vtype[0] = -1
    if H < 32 or H % 32:
        return
    while H % g:
        g -= 32
    g8 = gqa_group_type(GQA_G8, g, 0)
    if (tile_kernels(level, H) == NULL and _prompt_codes(GQA_S8_PC, level, H)
            and _prompt_codes(g8, level, H)):
        ktype[0] = GQA_S8_PC
        vtype[0] = g8


cdef gqa_qk_gemm_fn prompt_qk_kernel(int type, int level, int H) noexcept nogil:
    return _dotk.qk_gemm_s8_dot if _prompt_codes(type, level, H) else NULL


cdef const gqa_tiles *tile_kernels(int level, int H) noexcept nogil:
    return _tiles if level >= 3 and H % 16 == 0 else NULL


cdef int tile_rows(int level, int H) noexcept nogil:
    cdef const gqa_tiles *x = tile_kernels(level, H)
    return x.rows if x != NULL else 0


cdef int tile_steps(int level, int H) noexcept nogil:
    cdef const gqa_tiles *x = tile_kernels(level, H)
    return 0 if x == NULL else (2 if x.steps_direct else 1)


cdef gqa_sv_gemm_fn sv_kernel(const gqa_kernels *t, int type, int level, bint tiles, int rows,
                             int H) noexcept nogil:
    if tiles and dot_tiles(type, level) != NULL:
        return _tiles.sv_s8
    if tiles and float_tiles(type, level, rows) != NULL:
        return _tiles.sv_f
    if gqa_is_group(type):
        return (_gdot.sv_gemm_s8_dot if level >= 4 and _gdot != NULL
                and (tiles or _prompt_codes(type, level, H)) else t.sv_gemm)
    if _dotk != NULL and level >= 4 and gqa_dot_codes(type) and (
            tiles or (_dot_prompt_pv and (_dot_prompt_qk or type == GQA_S8_PT or type == GQA_S8_PC))):
        return _dotk.sv_gemm_s8_dot
    return t.sv_gemm


cdef gqa_exp_sum_fn exp_kernel(const gqa_kernels *t) noexcept nogil:
    return t.exp_sum if t.exp_sum != NULL else gqa_path_table(0).exp_sum


PATH_NAMES = tuple(gqa_path_name(i).decode() for i in range(GQA_PATH_COUNT))
COMPILED_PATHS = tuple(GQA_COMPILED_PATHS.decode().split(","))
# the paths' extra units the build compiled (setup.py's X86_UNITS / ARM_UNITS names)
COMPILED_UNITS = tuple(u for u in GQA_COMPILED_UNITS.decode().split(",") if u)
# the units a tests-only build states in portable code (setup.py's GQA_EMULATE_*): () in a release
EMULATED_UNITS = tuple(u for u in GQA_EMULATED_UNITS.decode().split(",") if u)


def cpu_features():
    """Names of the CPU features detected (those gqa cares about)."""
    cdef unsigned f = gqa_cpu_features()
    cdef unsigned i = 0
    out = []
    while gqa_cpu_feature_name(i) != NULL:
        if f & (1u << i):
            out.append(gqa_cpu_feature_name(i).decode())
        i += 1
    return out


def path_runnable(name):
    """True when path `name` was compiled into this build and this CPU runs it."""
    return name in PATH_NAMES and gqa_path_runnable(PATH_NAMES.index(name)) == 1


cdef const gqa_tiles *_pick_tiles(int path, choice):
    """Path `path`'s tiles for a tiles setting: True the best it runs here, a name those
    tiles where it runs them, False none."""
    if choice is False:
        return NULL
    if choice is True:
        return gqa_path_tiles(path)
    cdef int i = 0
    cdef const gqa_tiles *x = gqa_path_tiles_at(path, 0)
    while x != NULL and x.name.decode() != choice:
        i += 1
        x = gqa_path_tiles_at(path, i)
    return x if gqa_tiles_runnable(path, x) else NULL


def tile_names():
    """The names of the tiles compiled into any path of this build, best first."""
    out = []
    cdef int path, i
    for path in range(GQA_PATH_COUNT):
        i = 0
        while gqa_path_tiles_at(path, i) != NULL:
            name = gqa_path_tiles_at(path, i).name.decode()
            if name not in out:
                out.append(name)
            i += 1
    return tuple(out)


cdef str _unit_name(const gqa_kernels *t):
    """The name of level 4's unit whose table is t: the table's name, avx512's "avx512vnni"."""
    name = t.name.decode()
    return "avx512vnni" if name == "avx512" else name


def _set_path(name):
    """Make `name` the active path; the caller has validated it."""
    global _active, _tiles, _dotk, _dot_prompt_pv, _dot_prompt_qk, _gdot, _gdot_unit
    _active = gqa_path_table(PATH_NAMES.index(name))
    _tiles = _pick_tiles(PATH_NAMES.index(name), _tiles_choice)
    _dotk = gqa_s8_dot_table(PATH_NAMES.index(name))
    _dot_prompt_qk = _dotk != NULL and name == "avx2"
    _dot_prompt_pv = _dotk != NULL and (name == "avx512" or _dot_prompt_qk)
    _gdot = _dotk
    if _gdot == NULL and name == "avx512":
        _gdot = gqa_s8_dot_table(PATH_NAMES.index("avx2"))
    _gdot_unit = _unit_name(_gdot) if _gdot != NULL else None


def _set_tiles(choice):
    """The tiles setting (True: the best the active path runs here, False: none, or a name
    tiles_runnable accepts); after _set_path."""
    global _tiles, _tiles_choice
    _tiles_choice = choice
    _tiles = _pick_tiles(PATH_NAMES.index(active_path()), choice)


def active_path():
    return _active.name.decode()


def _set_approx_vnni(bint on):
    """Opt in/out; only takes effect where the VNNI kernel can run."""
    global _approx
    _approx = on and gqa_approx_vnni_runnable() == 1


def approx_vnni_runnable():
    return gqa_approx_vnni_runnable() == 1


def dot_runnable(name):
    """True when path `name`'s table has level 4's integer-dot kernels and this CPU runs them."""
    return name in PATH_NAMES and gqa_s8_dot_table(PATH_NAMES.index(name)) != NULL


def int8_dot_effective():
    """True when accuracy level 4 runs the integer-dot INT8 kernels on the active path."""
    return dot_tiles(GQA_S8_PT, 4) != NULL or _dotk != NULL


def int8_dot_unit():
    """Where accuracy level 4's INT8 dots of decode steps run with the active settings: the
    tiles' name ("amx"), "avx512vnni", "avxvnni", "avx2", "neon" (sdot), or None (the exact
    kernels)."""
    if dot_tiles(GQA_S8_PT, 4) != NULL:
        return _tiles.name.decode()
    return _unit_name(_dotk) if _dotk != NULL else None


def float_tile_types_at(int level, int H):
    """(K's C type, V's) a float32 cache's flash prompt tiles are quantized to at `level` with
    heads of H columns under the active settings (float_tile_types), or (-1, -1): float32."""
    cdef int kt, vt
    float_tile_types(level, H, &kt, &vt)
    return kt, vt


def group_dot_unit():
    """Where accuracy level 4's dots on per-group codes run with the active settings
    ("avx512vnni" on the avx512 path where the CPU has VNNI, "avxvnni" on avx2 where it has
    AVX-VNNI, else "avx2" on both, "neon" where the CPU has the dot product), or None (the exact
    kernels)."""
    return _gdot_unit


def tiles_effective():
    """The name of the matrix tiles ("amx", "avx512bf16", "neonbf16") accuracy levels 3 and 4 run prompts
    on with the active path, or None where it has none this CPU runs (or they are off)."""
    return _tiles.name.decode() if _tiles != NULL else None


def tiles_runnable(name=None):
    """True when some path of the build has tiles `name` (None: any) and this CPU and OS run
    them."""
    return any(_pick_tiles(i, True if name is None else name) != NULL for i in range(GQA_PATH_COUNT))


def approx_vnni_effective():
    """True when the opt-in approximate QK kernel is what INT8 per-tensor QK runs now."""
    return _approx and _active.qk_gemm_s8_approx != NULL


def l2_cache_bytes():
    return gqa_l2_cache_bytes()


def openmp_enabled():
    return gqa_openmp_enabled() == 1


def openmp_max_threads():
    return gqa_openmp_max_threads()


cdef extern from "gqa_kernels.h" nogil:
    float gqa_half_to_float(unsigned short h)
    unsigned short gqa_float_to_half(float f)


cdef void round_to_half(float *x, size_t n) noexcept nogil:
    cdef size_t i
    for i in range(n):
        x[i] = gqa_half_to_float(gqa_float_to_half(x[i]))


cdef extern from "gqa_kernels.h" nogil:
    size_t gqa_row_bytes_c "gqa_row_bytes"(int type, size_t cols)


# gqa_type_t (gqa_kernels.h, its one statement) by name, for gqa/_formats.py
TYPE_CODES = {"GQA_S8_PT": GQA_S8_PT, "GQA_S8_PC": GQA_S8_PC, "GQA_S4_PT": GQA_S4_PT,
              "GQA_S4_PC": GQA_S4_PC, "GQA_F32": GQA_F32, "GQA_F16": GQA_F16,
              "GQA_G8": GQA_G8, "GQA_G4": GQA_G4, "GQA_G2": GQA_G2}


def group_type(int kind, size_t group, bint meta16):
    """The C type value (gqa_group_type) of a per-group format of kind GQA_G8 / G4 / G2;
    arguments validated by the caller (gqa/_formats.py)."""
    return gqa_group_type(kind, group, meta16)


def row_bytes(int type, size_t cols):
    """Bytes of one stored row of `cols` elements of C type `type` (gqa_row_bytes)."""
    return gqa_row_bytes_c(type, cols)
