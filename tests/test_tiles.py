"""Accuracy levels 3 and 4 on prompts with bfloat16 tiles -- AMX (gqa/_src/kernels_amx.c),
AVX-512 BF16 dot products (gqa/_src/kernels_avx512bf16.c) and Arm's BFDOT
(gqa/_src/kernels_neonbf16.c): the flash tiles' QK and P @ V with
bfloat16 operands and float32 sums, the softmax in float32.

Every test on tiles runs once per kind of tiles (the `tiles` fixture: gqa.config(tiles=name)),
skipping with the reason those this CPU, OS or build does not run.  Against float64 over the
values the cache holds, every cache format, within the bound the roundings give (derived in
_bound).  Where the tiles do not run -- another path, a head that is not a multiple of 16
columns, gqa.config(tiles=False) -- levels 3 and 4 are level 0's float32 contract (or level 4's
VNNI kernels), checked bit for bit.  With causal float windows, a multi-token step's tiles of
codes or of the windows' floats run on the tiles, those some rows read both ways in float32.
tests/isa/test_isa.py[amx-*, avx512bf16-*, neonbf16-*] checks the kernels' contracts."""
import numpy as np
import pytest

import gqa
from gqa import _dispatch

F32 = np.float32
UB = 2.0 ** -9          # bfloat16 unit roundoff (8-bit significand, to nearest)
U = 2.0 ** -24          # float32's
N, NKV = 6, 2
G = N // NKV

NEEDS = {"amx": "AMX-TILE, AMX-BF16 and AVX512-BF16 with the tile state granted, or a build with "
                "GQA_EMULATE_AMX=1 or GQA_EMULATE_AVX512=1 (tests/hardening/test_sanitizers.py and "
                "test_emulated.py run them)",
         "avx512bf16": "AVX512-BF16, or a build with GQA_EMULATE_AVX512=1 (tests/hardening/test_emulated.py "
                       "runs one)",
         "neonbf16": "aarch64's BFloat16 extension (tests/isa neonbf16-qemu checks its kernels under qemu)"}


@pytest.fixture(params=list(NEEDS))
def tiles(request):
    """Each kind of tiles in turn, as gqa.config(tiles=name) for the test's duration."""
    name = request.param
    if not _dispatch.tiles_runnable(name):
        pytest.skip(f"this CPU, OS or build does not run the {name} tiles (they need {NEEDS[name]})")
    with gqa.config(tiles=name):
        yield name


needs_tiles = pytest.mark.usefixtures("tiles")

MODES = ["float", "int8-g16-fp16", "int8-pt", "int8-pc", "int4-pt", "int4-pc", "int4-g16", "int2-g16",
         "int8-g32", "int8-pc/pt", "int4-pc/pt"]


def _cache(mode, H, S, level, rng):
    fk, fv = gqa.parse_mode(gqa.cache_options(mode)["mode"])
    kw = {}
    if fk.static:
        nk, nv = (NKV * H if f.per_channel else 1 for f in (fk, fv))
        kw = dict(k_scales=rng.uniform(1.0, 1.5, nk).astype(F32) / fk.top_code,
                  v_scales=rng.uniform(1.0, 1.5, nv).astype(F32) / fv.top_code)
    return gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                       mode=mode, accuracy_level=level, **kw), (fk, fv)


def _values(cache, fs, H):
    """[2, Nkv, T, H] float64: the K and V values the cache's rows (formats fs = (K's, V's))
    dequantize to (float32, as every kernel path dequantizes them), per KV head."""
    T = cache.length
    out = np.empty((2, NKV, T, H))
    for w, (codes, scales) in enumerate(((cache.key[0], cache.k_scales[0]),
                                         (cache.value[0], cache.v_scales[0]))):
        f = fs[w]
        for j in range(NKV):
            rows = codes[0, j, :T]
            if not f.quantized:
                out[w, j] = rows.astype(np.float64)
                continue
            s = None
            if f.static:
                s = scales[j * H:(j + 1) * H] if f.per_channel else scales[:1]
            out[w, j] = gqa.dequantize(rows, s, bits=f.bits, head_size=H,
                                       group_size=f.group or None, metadata=f.metadata)
    return out


def _bound(sc_abs, w, v_abs, H, T):
    """The bound on |o' - o| of one output row (per column) at levels 3-4 on tiles.
    Scores: the query row times alpha (float32) and the K values each round to bfloat16
    (relative UB each), their exact products summed in float32 over H terms, so score j moves
    by at most e_j = (2 UB + UB^2 + (H + 4) U) sum_i |q_i alpha| |k_ji| (sc_abs); with D the
    largest e_j of the row the softmax weights move by a factor within exp(+-2 D).  The
    probabilities (exp_pack: within E = 2^-16 relative, in P and in the row sum l alike, so a
    weight moves by a factor within (1 + E) / (1 - E)) and the V values round to bfloat16 for
    P @ V (relative UB each), summed in float32 with the online rescaling (T + 16) U.  So
    |o' - o| <= (exp(2 D) (1 + E) / (1 - E) (1 + UB)^2 (1 + (T + 16) U) - 1) sum_j w_j |v_j|."""
    D = (2 * UB + UB * UB + (H + 4) * U) * sc_abs.max()
    E = 2.0 ** -16
    grow = np.exp(2 * D) * (1 + E) / (1 - E) * (1 + UB) ** 2 * (1 + (T + 16) * U)
    return (grow - 1) * (w @ v_abs) + 1e-30


def _attend(mode, H, S, level, blocks, rng, q_scale=1.0):
    c, f = _cache(mode, H, S, level, rng)
    q = (rng.uniform(-1, 1, (1, S, N * H)) * q_scale).astype(F32)
    k, v = (rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32) for _ in range(2))
    with gqa.config(path="avx512", flash=True, flash_blocks=blocks):
        out = c.attend(0, q, k, v)
    return c, f, q, out


def _check_against_float64(c, f, q, out, H, S, windows=None):
    """The S query rows q (the cache's last S positions, causal) against float64 over the
    values each row reads: the cache's codes, or with windows = (floats [2, Nkv, T, H], sink,
    recent) the floats at its causal windows' positions (the first sink, the last recent of
    its own keys)."""
    KV = _values(c, f, H)
    T = KV.shape[2]
    alpha = F32(1.0 / np.sqrt(H))
    qh = q.reshape(S, N, H).astype(np.float64)
    worst = 0.0
    for h in range(N):
        j = h // G
        qa = (q.reshape(S, N, H)[:, h] * alpha).astype(np.float64)   # float32 q * alpha
        for s in range(S):
            end = T - S + s + 1
            K, V = KV[0, j, :end], KV[1, j, :end]
            if windows is not None:
                fl, sink, recent = windows
                ns = min(sink, end)
                nr = min(recent, end - ns)
                flo = np.zeros((end, 1), bool)
                flo[:ns] = flo[end - nr:] = True
                K, V = np.where(flo, fl[0, j, :end], K), np.where(flo, fl[1, j, :end], V)
            sc = K @ qh[s, h] * float(alpha)
            p = np.exp(sc - sc.max())
            w = p / p.sum()
            ref = w @ V
            bound = _bound(np.abs(K) @ np.abs(qa[s]), w, np.abs(V), H, end)
            err = np.abs(out[0, s, h * H:(h + 1) * H] - ref)
            assert (err <= bound).all(), (h, s, err.max(), bound.min())
            worst = max(worst, (err / bound).max())
    return worst


@needs_tiles
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", [3, 4])
def test_prompt_on_tiles_within_its_bound(mode, level):
    """A causal prompt on the default tile plan: every output row within the bound of float64
    over the cache's values, and not level 0's bits (the tiles ran)."""
    rng = np.random.default_rng(11)
    S, H = 70, 64
    c, f, q, out = _attend(mode, H, S, level, None, rng)
    _check_against_float64(c, f, q, out, H, S)
    c0, _, _, out0 = _attend(mode, H, S, 0, None, np.random.default_rng(11))
    assert not np.array_equal(out, out0)


@needs_tiles
@pytest.mark.parametrize("blocks", [(1, 1), (3, 7), (5, 33), (16, 64), (40, 100)])
@pytest.mark.parametrize("H", [16, 48, 80, 128])
def test_tile_edges_within_the_bound(blocks, H):
    """Rows, keys and heads that do not fill a tile (M padded to 16, keys and the head's K
    dimension to 32): padding never reaches an output."""
    rng = np.random.default_rng(12)
    S = 45
    c, f, q, out = _attend("int8-pc", H, S, 3, blocks, rng)
    _check_against_float64(c, f, q, out, H, S)


@needs_tiles
def test_large_scores_within_the_bound():
    """Scores spread over tens of units (peaked softmax rows): the bound scales with them."""
    rng = np.random.default_rng(13)
    S, H = 50, 64
    c, f, q, out = _attend("float", H, S, 3, (8, 32), rng, q_scale=8.0)
    _check_against_float64(c, f, q, out, H, S)


@pytest.mark.parametrize("case", ["avx2", "head-24", "tiles-off"])
@pytest.mark.parametrize("mode", ["float", "int8-pt", "int4-g8"])
def test_level_3_without_tiles_is_level_0(case, mode):
    """Where the tiles do not run, level 3 is level 0 bit for bit."""
    path = "avx2" if case == "avx2" else "avx512"
    if path not in gqa.available_paths():
        pytest.skip(f"this CPU cannot run the {path} path")
    H = 24 if case == "head-24" else 64
    S = 40
    outs = []
    for level in (0, 3):
        rng = np.random.default_rng(14)
        c, _ = _cache(mode, H, S, level, rng)
        q = rng.uniform(-1, 1, (1, S, N * H)).astype(F32)
        k, v = (rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32) for _ in range(2))
        with gqa.config(path=path, tiles=case != "tiles-off", flash_blocks=(8, 16)):
            outs.append(c.attend(0, q, k, v))
    assert np.array_equal(outs[0], outs[1])


@needs_tiles
@pytest.mark.parametrize("mode", ["int4-g16+s2r5", "int8-pc+s3r4", "int2-g16+s0r6", "int8-g32+s4r0"])
@pytest.mark.parametrize("blocks", [None, (4, 8), (16, 7)])
def test_causal_float_windows_within_the_bound(mode, blocks):
    """A prompt, then a multi-token step, with causal float windows (staged tiles: those of
    codes only or of the windows' floats only on the tiles, mixed ones in float32): every
    output row within the bound of float64 over the values it reads, and the prompt not level
    0's bits (the tiles ran)."""
    H, S1, S2 = 64, 40, 13
    rng = np.random.default_rng(15)
    x = lambda n, w: rng.uniform(-1, 1, (1, n, w * H)).astype(F32)  # noqa: E731
    steps = [(x(n, N), x(n, NKV), x(n, NKV)) for n in (S1, S2)]
    # the rows the windows hold: [2, Nkv, T, H]
    fl = np.stack([np.concatenate([st[i] for st in steps], 1)[0].reshape(-1, NKV, H)
                   .transpose(1, 0, 2) for i in (1, 2)]).astype(np.float64)
    prompts = []
    for level in (3, 0):
        c, f = _cache(mode, H, S1 + S2, level, np.random.default_rng(16))
        for n, (q, k, v) in zip((S1, S2), steps):
            with gqa.config(path="avx512", flash_blocks=blocks):
                out = c.attend(0, q, k, v)
            if level == 3:
                T = c.length
                _check_against_float64(c, f, q, out, H, n,
                                       (fl[:, :, :T], c.sink_size, c.recent_size))
            prompts.append(out) if n == S1 else None
    assert not np.array_equal(prompts[0], prompts[1])


@needs_tiles
def test_masked_inf_values_stay_out():
    """A key whose V value is inf, masked (causal) for the rows before it: those rows stay
    finite and within the bound (their tile's P @ V runs in float32 over each row's own keys,
    as level 0 does), the rows that read it are inf / NaN as at level 0."""
    rng = np.random.default_rng(16)
    H, S = 64, 40
    q = rng.uniform(-1, 1, (1, S, N * H)).astype(F32)
    k = rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32)
    v = rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32)
    v[0, 33, :] = np.inf
    outs = {}
    for level in (0, 3):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                        mode="float", accuracy_level=level)
        with gqa.config(path="avx512", flash_blocks=(8, 16)):
            outs[level] = c.attend(0, q, k, v)
    assert np.isfinite(outs[3][0, :33]).all()
    assert np.array_equal(np.isfinite(outs[3][0, 33:]), np.isfinite(outs[0][0, 33:]))
    assert not np.isfinite(outs[3][0, 33:]).all()
    c3 = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=33,
                     mode="float", accuracy_level=3)
    with gqa.config(path="avx512", flash_blocks=(8, 16)):
        part = c3.attend(0, q[:, :33], k[:, :33], v[:, :33])
    _check_against_float64(c3, gqa.parse_mode("float"), q[:, :33], part, H, 33)
    np.testing.assert_allclose(outs[3][0, :33], part[0], rtol=0, atol=0.05)


@needs_tiles
@pytest.mark.parametrize("threads", [1, 2])
def test_inf_value_in_a_kept_tile_stays_out_of_earlier_blocks(threads):
    """Each thread keeps a unit's packed K / V tiles from query block to block (the last
    blocks first), so a block can meet a kept tile that holds keys past its own: query tiles
    of 8 rows, key tiles of 16; block [32, 40) packs keys [0, 40), and block [16, 24) then
    reads kept tile [16, 32) for its keys [16, 24).  V's inf at key 27 lies among those extra
    keys: rows 16-26 stay finite (the tile's P @ V runs per row over each row's own keys) and
    within the bound of float64, rows 27 on are inf / NaN as at level 0."""
    rng = np.random.default_rng(23)
    H, S, bad_key = 64, 40, 27
    q = rng.uniform(-1, 1, (1, S, N * H)).astype(F32)
    k = rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32)
    v = rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32)
    v[0, bad_key, :] = np.inf
    outs = {}
    for level in (0, 3):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                        mode="float", accuracy_level=level)
        with gqa.config(path="avx512", flash_blocks=(8, 16), num_threads=threads):
            outs[level] = c.attend(0, q, k, v)
    assert np.isfinite(outs[3][0, :bad_key]).all()
    assert np.array_equal(np.isfinite(outs[3][0, bad_key:]), np.isfinite(outs[0][0, bad_key:]))
    # the rows before the inf against float64 over the keys they read (a cache of those alone)
    c3 = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=bad_key,
                     mode="float")
    c3.attend(0, q[:, :bad_key], k[:, :bad_key], v[:, :bad_key])
    _check_against_float64(c3, gqa.parse_mode("float"), q[:, :bad_key], outs[3][:, :bad_key], H,
                           bad_key)


@needs_tiles
def test_threads_give_the_same_bits():
    """Results depend on the tile plan only, never on the thread count."""
    rng = np.random.default_rng(17)
    H, S = 64, 300
    q = rng.uniform(-1, 1, (1, S, N * H)).astype(F32)
    k, v = (rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32) for _ in range(2))
    outs = []
    for threads in (1, 2, 3):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                        mode="int8-pt", k_scales=np.array([0.01], F32), v_scales=np.array([0.01], F32),
                        accuracy_level=3)
        with gqa.config(path="avx512", num_threads=threads):
            outs.append(c.attend(0, q, k, v))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@needs_tiles
def test_torch_between_calls():
    """oneDNN's kernels (torch bfloat16 matmul, AMX where the CPU has it) between gqa's calls
    on the same thread: each side loads its own tile configuration, so both keep their
    results."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(18)
    H, S = 64, 100
    q = rng.uniform(-1, 1, (1, S, N * H)).astype(F32)
    k, v = (rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32) for _ in range(2))
    a = torch.from_numpy(rng.uniform(-1, 1, (512, 512)).astype(F32)).to(torch.bfloat16)
    want_t = (a @ a).float().numpy()

    def ours():
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                        mode="float", accuracy_level=3)
        with gqa.config(path="avx512"):
            return c.attend(0, q, k, v)
    first = ours()
    for _ in range(3):
        assert np.array_equal((a @ a).float().numpy(), want_t)
        assert np.array_equal(ours(), first)


@pytest.mark.parametrize("mode", ["int8-pt", "float", "int4-g32"])
def test_steps_of_few_rows(tiles, mode):
    """A step of 2 tokens (6 rows per KV head, within level 3's limits: 8 rows for per-group
    codes, 16 for float rows, 24 for INT8 per tensor at these heads and units):
    AVX-512 BF16 leaves it to the decode kernels -- level 3 gives level 1's bits, level 4 those
    of level 4 without tiles; float rows the tiles' bfloat16 decode kernels at levels 3 and 4
    alike --, AMX and BFDOT run it on their tiles (not level 1's bits).  A step of 30 tokens
    (90 rows) runs on the tiles everywhere."""
    H, past = 64, 60
    rng = np.random.default_rng(19)
    x = lambda n, w: rng.uniform(-1, 1, (1, n, w * H)).astype(F32)  # noqa: E731
    prompt = (x(past, N), x(past, NKV), x(past, NKV))
    for S in (2, 30):
        step = (x(S, N), x(S, NKV), x(S, NKV))
        outs = {}
        for level, name in ((1, tiles), (3, tiles), (4, tiles), (4, False)):
            c, _ = _cache(mode, H, past + S, level, np.random.default_rng(20))
            with gqa.config(tiles=name):
                c.attend(0, *prompt)
                outs[level, name] = c.attend(0, *step)
        direct = S == 2 and tiles == "avx512bf16"
        if direct and mode == "float":   # 6 rows of float32 K / V: the bfloat16 decode kernels
            assert not np.array_equal(outs[3, tiles], outs[1, tiles])
            assert np.array_equal(outs[4, tiles], outs[3, tiles])
            continue
        assert np.array_equal(outs[3, tiles], outs[1, tiles]) == direct
        if direct:
            assert np.array_equal(outs[4, tiles], outs[4, False])


def test_tiles_setting_is_checked():
    """gqa.config(tiles=): a bool or the name of tiles this build has and this CPU runs."""
    with pytest.raises(TypeError, match="tiles"):
        gqa.config(tiles=1)
    with pytest.raises(ValueError, match="not tiles of this build"):
        gqa.config(tiles="sme")
    assert gqa.available_tiles() == [n for n in _dispatch.tile_names() if _dispatch.tiles_runnable(n)]
    for name in _dispatch.tile_names():
        if name not in gqa.available_tiles():
            with pytest.raises(ValueError, match="cannot run here"):
                gqa.config(tiles=name)
        else:
            with gqa.config(tiles=name):
                want = name if "avx512" in gqa.available_paths() else None
                assert gqa.get_config()["tiles_effective"] == want
    with gqa.config(tiles=False):
        assert gqa.get_config()["tiles_effective"] is None


@needs_tiles
def test_inf_value_left_behind_by_the_window():
    """A V value of inf at key 5 with a local window of 8: rows 5-12 read it (inf / NaN, as at
    level 0), every later row has left it behind (masked before the row's first key, in a tile
    that holds it) and stays finite, within the bound of a cache that never held it (the rows
    of the tile that holds it take the float32 P @ V)."""
    rng = np.random.default_rng(18)
    H, S, W = 64, 48, 8
    q = rng.uniform(-1, 1, (1, S, N * H)).astype(F32)
    k = rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32)
    v = rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32)
    bad = v.copy()
    bad[0, 5, :] = np.inf
    outs = {}
    for level, vv in ((0, bad), (3, bad), (-3, v)):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                        mode="float", accuracy_level=abs(level), local_window_size=W)
        with gqa.config(path="avx512", flash_blocks=(8, 32)):
            outs[level] = c.attend(0, q, k, vv)
    assert np.array_equal(np.isfinite(outs[3][0, 5:5 + W + 1]), np.isfinite(outs[0][0, 5:5 + W + 1]))
    assert not np.isfinite(outs[3][0, 5:5 + W]).any()
    assert np.isfinite(outs[3][0, 5 + W + 1:]).all()
    np.testing.assert_allclose(outs[3][0, 5 + W + 1:], outs[-3][0, 5 + W + 1:], rtol=0, atol=0.05)
    assert np.array_equal(outs[3][0, 32:], outs[-3][0, 32:])   # rows 32-: key tiles from 24 on, all on tiles


@pytest.mark.parametrize("heads", [(6, 2), (16, 2), (4, 2)], ids=["G3", "G8", "G2"])
@pytest.mark.parametrize("level", [3, 4])
def test_float_decode_within_the_bound(tiles, heads, level):
    """Decode steps over a float32 cache at levels 3-4: where the tiles have bfloat16 decode
    kernels of float rows (AVX-512 BF16's, gqa_tiles.qk_f / sv_f) and a KV head has 3 query rows
    or more, each output row within the tiles' bound of float64 over the cache's values (the
    same roundings: the query times alpha, K and V values and the probabilities to bfloat16,
    float32 sums), and not level 0's bits; elsewhere (G = 2, the other tiles) level 0's bits."""
    n, nkv = heads
    H, past, steps = 64, 2100, 3     # 2 threads, each step in key chunks (flash decoding)
    rng = np.random.default_rng(21)
    x = lambda s, w: rng.uniform(-1, 1, (1, s, w * H)).astype(F32)  # noqa: E731
    prompt = (x(past, n), x(past, nkv), x(past, nkv))
    seq = [(x(1, n) * 4, x(1, nkv), x(1, nkv)) for _ in range(steps)]
    outs = {}
    for lv in (0, level):
        c = gqa.KVCache(num_layers=1, num_heads=n, kv_num_heads=nkv, head_size=H,
                        max_length=past + steps, mode="float", accuracy_level=lv)
        c.attend(0, *prompt)
        outs[lv] = [c.attend(0, *st) for st in seq]
    bf16 = tiles == "avx512bf16" and n // nkv >= 3
    for o0, o in zip(outs[0], outs[level]):
        assert np.array_equal(o0, o) != bf16
    if not bf16:
        return
    g = n // nkv
    alpha = F32(1.0 / np.sqrt(H))
    K = np.concatenate([prompt[1]] + [st[1] for st in seq], axis=1).reshape(-1, nkv, H).astype(np.float64)
    V = np.concatenate([prompt[2]] + [st[2] for st in seq], axis=1).reshape(-1, nkv, H).astype(np.float64)
    for i, (q, _, _) in enumerate(seq):
        T = past + i + 1
        for h in range(n):
            j = h // g
            qa = (q.reshape(n, H)[h] * alpha).astype(np.float64)       # float32 q * alpha
            sc = K[:T, j] @ q.reshape(n, H)[h].astype(np.float64) * float(alpha)
            p = np.exp(sc - sc.max())
            w = p / p.sum()
            ref = w @ V[:T, j]
            bound = _bound(np.abs(K[:T, j]) @ np.abs(qa), w, np.abs(V[:T, j]), H, T)
            err = np.abs(outs[level][i][0, 0, h * H:(h + 1) * H] - ref)
            assert (err <= bound).all(), (i, h, err.max(), bound.min())


@needs_tiles
def test_inf_value_before_a_tile_stays_out_of_it():
    """The NaN / inf check of a tile's masked keys reads that tile's V rows only.  Local
    window 4, query tiles of 16 rows, key tiles of 8 from each query tile's first key: query
    tile [16, 32) reads key tiles [13, 21), [21, 29), [29, 32).  Row 16's keys end before the
    second; V's inf at key 18 lies in the first (whose masked keys hold it: float32 P @ V,
    for rows 16-23) and before the second.  Rows 24-47 never read [13, 21), so they keep the
    bits of a cache without the inf (a check reaching back from the second tile sent it, and
    rows 24-31, to the float32 P @ V)."""
    rng = np.random.default_rng(22)
    H, S, W, bad_key = 64, 48, 4, 18
    q = rng.uniform(-1, 1, (1, S, N * H)).astype(F32)
    k = rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32)
    v = rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32)
    bad = v.copy()
    bad[0, bad_key, :] = np.inf
    outs = {}
    for name, level, vv in (("bad", 3, bad), ("clean", 3, v), ("level0", 0, v)):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                        mode="float", accuracy_level=level, local_window_size=W)
        with gqa.config(path="avx512", flash_blocks=(16, 8)):
            outs[name] = c.attend(0, q, k, vv)[0]
    assert not np.isfinite(outs["bad"][bad_key:bad_key + W]).any()
    assert np.isfinite(outs["bad"][bad_key + W:]).all()
    assert not np.array_equal(outs["clean"][24:], outs["level0"][24:])    # the tiles ran
    assert np.array_equal(outs["bad"][24:], outs["clean"][24:])
