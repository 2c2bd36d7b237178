"""hypothesis strategies for valid GroupQueryAttention specs (see _hard_cases.build)."""
from hypothesis import strategies as st

import gqa

# NONE last: hypothesis favours the first element of sampled_from
MODES = [("PER_TENSOR", 8), ("PER_CHANNEL", 4), ("PER_CHANNEL", 8), ("PER_TENSOR", 4), ("NONE", 0)]
QMODES = ("PER_TENSOR", "PER_CHANNEL")


@st.composite
def specs(draw, big=False, phase=None, prompt_rows=(1, 12)):
    """A valid call. Shapes stay small (the oracle's cost is per session, ours per element);
    `big` allows lengths and widths where the compute really runs multi-threaded; `phase`
    fixes the phase, `prompt_rows` bounds a prompt's S."""
    if phase is None:
        phase = draw(st.sampled_from(["prompt", "decode", "decode", "subsequent"]), label="phase")
    Nkv = draw(st.integers(1, 4), label="Nkv")
    G = draw(st.sampled_from([1, 2, 3, 4, 8]), label="G")
    rotary = draw(st.booleans(), label="rotary")
    hs = [8, 16, 24, 32, 48, 64] + ([128, 256] if big else [80, 128])
    H = draw(st.sampled_from(hs), label="H")
    if rotary and H % 16:
        H += 8
    B = 1 if phase == "subsequent" else draw(st.integers(1, 3), label="B")
    maxpast = 300 if big else 40
    if phase == "prompt":
        S = draw(st.integers(*prompt_rows), label="S")
        past, pasts = 0, None
        prompt_lens = draw(st.none() | st.lists(st.integers(1, S), min_size=B, max_size=B), label="lens")
    else:
        S = 1 if phase == "decode" else draw(st.integers(2, 8), label="S")
        past = draw(st.integers(1, maxpast), label="past")
        pasts = draw(st.none() | st.lists(st.integers(0, past), min_size=B, max_size=B), label="pasts")
        if pasts is not None:
            pasts[draw(st.integers(0, B - 1))] = past   # max past rows > 0: not a first prompt
        prompt_lens = None
    mode, bits = draw(st.sampled_from(MODES), label="mode")
    v_mode = mode
    if mode != "NONE" and draw(st.integers(0, 3), label="mixed") == 0:
        v_mode = QMODES[1 - QMODES.index(mode)]
    packed = draw(st.booleans(), label="packed")
    shared_kv = (phase != "prompt" and not packed and draw(st.integers(0, 9), label="shared_kv") == 0)
    causal = draw(st.integers(0, 5), label="causal") > 0
    window = draw(st.sampled_from([-1, -1, -1, 0, 1, 2, 3, 5, 8]), label="window") if causal else -1
    rot_dim = None
    if rotary:
        rot_dim = draw(st.sampled_from([None] + list(range(16, H + 1, 16))), label="rot_dim")
    inplace = phase != "prompt" and draw(st.integers(0, 2), label="inplace") == 0
    return dict(
        seed=draw(st.integers(0, 2 ** 16), label="seed"), phase=phase, B=B, S=S, past=past,
        pasts=pasts, prompt_lens=prompt_lens, N=Nkv * G, Nkv=Nkv, H=H, mode=mode, v_mode=v_mode,
        bits=bits, dtype=draw(st.sampled_from(["f32", "f32", "f16"]), label="dtype"),
        buf_extra=0 if phase == "prompt" else draw(st.sampled_from([0, 0, 1, 7]), label="buf_extra"),
        T_extra=0 if phase == "prompt" else draw(st.sampled_from([0, 0, 0, 2]), label="T_extra"),
        packed=packed, shared_kv=shared_kv, rotary=rotary,
        interleaved=rotary and draw(st.booleans(), label="interleaved"), rot_dim=rot_dim,
        pos_ids=rotary and draw(st.booleans(), label="pos_ids"),
        bias=draw(st.sampled_from([None, None, "full", "b1", "n1", "both1"]), label="bias"),
        sink=draw(st.integers(0, 3), label="sink") == 0,
        smooth=draw(st.integers(0, 3), label="smooth") == 0,
        window=window,
        softcap=draw(st.sampled_from([0.0, 0.0, 0.0, 0.3, 2.0]), label="softcap"),
        qk_output=draw(st.sampled_from([0, 0, 0, 0, 1, 2]), label="qk_output"),
        scale=draw(st.sampled_from([0.0, 0.0, 0.0, 0.21, 1.5]), label="scale"),
        causal=causal, inplace=inplace, t_array=draw(st.booleans(), label="t_array"))


@st.composite
def runtimes(draw):
    """Where and how a call runs: kernel path, thread count, flash tiling / decode splits."""
    return dict(
        kernel=draw(st.sampled_from(gqa.available_paths()), label="kernel"),
        threads=draw(st.integers(1, 3), label="threads"),
        blocks=draw(st.sampled_from([None, None, (1, 1), (2, 3), (3, 17), (16, 5)]), label="blocks"),
        splits=draw(st.sampled_from([None, None, 2, 3, 64]), label="splits"))
