"""The GroupQueryAttention operator (ONNX Runtime 1.31.1 CPU contract).

Validation happens here, completely, before any output or caller buffer is
written; the compute (gqa/_attention.pyx) then runs without the GIL.
"""
import numbers

import numpy as np

from . import _attention, _config, _step
from . import _validate as v

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
_QUANT_TYPES = ("NONE", "PER_TENSOR", "PER_CHANNEL")
_INT32 = (np.dtype(np.int32),)
_INT64 = (np.dtype(np.int64),)

# gqa_type_t values (gqa_kernels.h)
_S8_PT, _S8_PC, _S4_PT, _S4_PC, _F32, _F16 = range(6)
_INT32_MAX = 2 ** 31 - 1   # sizes and lengths reach the compute as C int


def _int_attr(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _quant_attr(name, value):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    u = value.upper()
    if u not in _QUANT_TYPES:
        raise ValueError(f"Invalid KV quantization type {name}={value!r}. "
                         f"Valid values are: NONE, PER_TENSOR, PER_CHANNEL")
    return u


class GroupQueryAttention:
    """One GroupQueryAttention node: attributes validated once, then called per step.

    ``GroupQueryAttention(num_heads=32, kv_num_heads=8, k_quant_type="PER_TENSOR",
    v_quant_type="PER_TENSOR", kv_cache_bit_width=8)(query, key, value, past_key, ...)``
    returns ``(output, present_key, present_value[, output_qk])``.  Attribute names,
    meanings and defaults are ONNX Runtime's (see the README).
    """

    def __init__(self, *, num_heads, kv_num_heads, scale=0.0, softcap=0.0, local_window_size=-1,
                 causal=1, do_rotary=0, rotary_interleaved=0, smooth_softmax=-1, qk_output=0,
                 k_quant_type="NONE", v_quant_type="NONE", kv_cache_bit_width=0):
        self.num_heads = _int_attr("num_heads", num_heads)
        self.kv_num_heads = _int_attr("kv_num_heads", kv_num_heads)
        if self.num_heads <= 0:
            raise ValueError(f"num_heads must be > 0, got {self.num_heads}")
        if self.kv_num_heads <= 0:
            raise ValueError(f"kv_num_heads must be > 0, got {self.kv_num_heads}")
        for name in ("num_heads", "kv_num_heads"):
            if getattr(self, name) > _INT32_MAX:
                raise ValueError(f"{name} must be <= {_INT32_MAX}, got {getattr(self, name)}")
        if self.num_heads % self.kv_num_heads:
            raise ValueError("num_heads must be a multiple of kv_num_heads. Got num_heads % "
                             f"kv_num_heads == {self.num_heads % self.kv_num_heads}")
        self.scale = v.real(scale, "scale")
        self.softcap = v.real(softcap, "softcap")
        if self.softcap < 0:
            raise ValueError(f"softcap must be >= 0 (0 disables it), got {self.softcap}")
        self.local_window_size = _int_attr("local_window_size", local_window_size)
        if self.local_window_size < -1:
            raise ValueError(f"local_window_size must be -1 (disabled) or >= 0, got {self.local_window_size}")
        if self.local_window_size > _INT32_MAX:
            raise ValueError(f"local_window_size must be <= {_INT32_MAX}, got {self.local_window_size}")
        self.causal = _int_attr("causal", causal)
        if self.causal not in (0, 1):
            raise ValueError(f"causal must be 0 or 1, got {self.causal}")
        if self.causal == 0 and self.local_window_size != -1:
            raise ValueError("local_window_size must be -1 when causal is 0, got "
                             f"{self.local_window_size}")
        self.do_rotary = _int_attr("do_rotary", do_rotary)
        self.rotary_interleaved = _int_attr("rotary_interleaved", rotary_interleaved)
        self.smooth_softmax = _int_attr("smooth_softmax", smooth_softmax)
        self.qk_output = _int_attr("qk_output", qk_output)
        if self.qk_output not in (0, 1, 2):
            raise ValueError(f"qk_output attribute received unsupported value {self.qk_output}; "
                             "valid: 0 (none), 1 (before softmax), 2 (after softmax)")
        self.k_quant_type = _quant_attr("k_quant_type", k_quant_type)
        self.v_quant_type = _quant_attr("v_quant_type", v_quant_type)
        self.kv_cache_bit_width = _int_attr("kv_cache_bit_width", kv_cache_bit_width)
        kq, vq, bits = self.k_quant_type, self.v_quant_type, self.kv_cache_bit_width
        if kq == "NONE" or vq == "NONE":
            if kq != vq:
                raise ValueError(f"k_quant_type ({kq}) and v_quant_type ({vq}) must both be NONE or "
                                 "both quantized (PER_TENSOR / PER_CHANNEL)")
            if bits != 0:
                raise ValueError(f"kv_cache_bit_width must be 0 when quantization is disabled, got {bits}")
        elif bits not in (4, 8):
            raise ValueError(f"kv_cache_bit_width must be 4 or 8 when quantization is enabled, got {bits}")
        self.quantized = kq != "NONE"

    def __repr__(self):
        return (f"GroupQueryAttention(num_heads={self.num_heads}, kv_num_heads={self.kv_num_heads}, "
                f"k_quant_type={self.k_quant_type!r}, v_quant_type={self.v_quant_type!r}, "
                f"kv_cache_bit_width={self.kv_cache_bit_width})")

    # -- the call ------------------------------------------------------------------
    # op(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
    #    total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
    #    attention_bias=None, head_sink=None, k_scale=None, v_scale=None, *,
    #    present_key=None, present_value=None, num_threads=None):
    # a repeat of the signature whose short path (gqa/_step.pyx) proves it valid runs there;
    # every other call comes down to _call.
    __call__ = _step.op_call

    def _call(self, query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
              cos_cache, sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
              present_key, present_value, num_threads):
        # Checks that depend on the inputs' types, dtypes, shapes and identities only are done
        # once per signature (a decoding loop repeats one); the checks that depend on values
        # (lengths, positions) run on every call.  Both finish before anything is written.
        # A repeat of the signature the short path declined keeps the signature's checks.
        step = self._step
        st = None
        if step is not None and step.matches(query, key, value, past_key, past_value, seqlens_k,
                                             cos_cache, sin_cache, position_ids, attention_bias,
                                             head_sink, k_scale, v_scale, present_key, present_value):
            st = step.st
        if st is None:
            st = self._static(query, key, value, past_key, past_value, seqlens_k, cos_cache,
                              sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                              present_key, present_value)
            # one attribute holds the signature and its checks together (threads may share
            # the operator)
            self._step = _step.Step(st, self.qk_output, query, key, value, past_key, past_value,
                                    seqlens_k, cos_cache, sin_cache, position_ids, attention_bias,
                                    head_sink, k_scale, v_scale, present_key, present_value)
        B, S, N, Nkv, H, L = st.B, st.S, self.num_heads, self.kv_num_heads, st.H, st.L
        Pbuf, has_past, shared = st.Pbuf, st.has_past, st.shared

        T = self._total_length(total_sequence_length)
        if shared:
            _attention.check_no_alias(past_key, past_value, query, key, value, seqlens_k, k_scale,
                                      v_scale, cos_cache, sin_cache, position_ids, attention_bias,
                                      head_sink, total_sequence_length)
        if S > T:
            raise ValueError(f"total_sequence_length ({T}) must be >= sequence_length ({S}, query "
                             "dimension 1): the new tokens are part of the total")
        Pres = Pbuf if shared else max(T, Pbuf)
        if shared and T > Pbuf:
            raise ValueError(f"total_sequence_length ({T}) exceeds the shared buffer length "
                             f"past_key.shape[2] = {Pbuf} (in-place mode)")
        if L == 0 and T > Pbuf:
            raise ValueError(f"total_sequence_length ({T}) exceeds past buffer size ({Pbuf}) in "
                             "shared KV mode")
        first_prompt = (S == T) and L != 0
        if S > 1 and S != T and B != 1 and has_past:
            raise ValueError("batch_size must be 1 when sequence_length > 1 and past context is given.")
        if S != T and not has_past:
            raise ValueError(f"sequence_length ({S}) < total_sequence_length ({T}) needs past_key and "
                             "past_value (the earlier tokens' cache)")
        Tmax = _check_seqlens(seqlens_k, B, S, T, Pres, Pbuf, L, has_past, shared, first_prompt)
        if st.rot_half:
            _check_positions(cos_cache.shape[0], position_ids, seqlens_k, B, S, T, first_prompt)
        if attention_bias is not None and attention_bias.shape[3] != T:
            raise ValueError(f"attention_bias must have shape (batch_size or 1, num_heads or 1, "
                             f"sequence_length, total_sequence_length) = ({B} or 1, {N} or 1, {S}, "
                             f"{T}), got {attention_bias.shape}")

        # outputs
        pshape = (B, Nkv, Pres, st.Hp)
        if present_key is None:
            present_key = np.empty(pshape, st.cache_dt)
            present_value = np.empty(pshape, st.cache_dt)
        elif not shared:
            inputs = (query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache,
                      position_ids, attention_bias, head_sink, k_scale, v_scale)
            v.out_array(present_key, "present_key", pshape, st.cache_dt, *inputs)
            v.out_array(present_value, "present_value", pshape, st.cache_dt, *inputs)
            if np.may_share_memory(present_key, present_value):
                raise ValueError("present_key and present_value must not overlap")
        nt = _config.effective_num_threads(num_threads)
        cfg = _config._settings
        q_block, kv_block, splits, ranges = _step.flash_plan(B, S, Nkv, N // Nkv, H, Tmax)

        # float32 views of the float inputs (float16 is computed in float32)
        q32 = _f32(query)
        if st.packed:
            k32 = q32[..., N * H:]
            v32 = q32[..., (N + Nkv) * H:]
        else:
            k32, v32 = _f32(key), _f32(value)
        out = np.empty((B, S, N * H), np.float32)
        qk_out = np.empty((B, N, S, T), np.float32) if self.qk_output else None
        f16 = st.dt == np.float16
        _attention.run(
            st.consts, q32, k32, v32, v.contiguous(seqlens_k), present_key, present_value,
            None if shared or not has_past else v.contiguous(past_key),
            None if shared or not has_past else v.contiguous(past_value),
            st.ks, st.vs,
            None if not st.rot_half else _f32(cos_cache), None if not st.rot_half else _f32(sin_cache),
            v.contiguous(position_ids) if st.rot_half and position_ids is not None else None,
            None if attention_bias is None else _f32(attention_bias),
            None if head_sink is None else _f32(head_sink),
            out, qk_out, T, Pres, first_prompt, nt, cfg["flash"], q_block, kv_block, splits, ranges)

        if f16:
            out = out.astype(np.float16)
            qk_out = qk_out.astype(np.float16) if qk_out is not None else None
        if qk_out is not None:
            return out, present_key, present_value, qk_out
        return out, present_key, present_value

    _step = None

    def _static(self, query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache,
                position_ids, attention_bias, head_sink, k_scale, v_scale, present_key, present_value):
        """Every check that does not depend on array values or on total_sequence_length."""
        N, Nkv = self.num_heads, self.kv_num_heads
        st = _Static()
        v.array(query, "query", _FLOATS, ndim=3)
        dt = st.dt = query.dtype
        B, S, D = query.shape
        if (key is None) != (value is None):
            raise ValueError("Input 'key' and 'value' shall be both present, or both absent in the "
                             "case of packed qkv.")
        packed = key is None
        if packed:
            if D % (N + 2 * Nkv):
                raise ValueError(f"query (packed QKV) last dimension {D} must be (num_heads + 2 * "
                                 f"kv_num_heads) * head_size = {N + 2 * Nkv} * head_size")
            H = D // (N + 2 * Nkv)
            L = S
        else:
            if D % N:
                raise ValueError(f"query last dimension {D} must be num_heads * head_size "
                                 f"(num_heads = {N})")
            H = D // N
            for name, x in (("key", key), ("value", value)):
                v.array(x, name, (dt,), ndim=3)
                if x.shape[0] != B:
                    raise ValueError(f"Input 'query' and '{name}' shall have same dim 0 (batch size); "
                                     f"got {B} and {x.shape[0]}")
                if x.shape[2] != Nkv * H:
                    raise ValueError(f"Input '{name}' last dimension must be kv_num_heads * head_size = "
                                     f"{Nkv} * {H} = {Nkv * H}, got {x.shape[2]}")
            if key.shape[1] != value.shape[1]:
                raise ValueError(f"Input 'key' and 'value' shall have same dim 1 (sequence length); "
                                 f"got {key.shape[1]} and {value.shape[1]}")
            L = key.shape[1]
            if L != S and L != 0:
                raise ValueError(f"Input 'query' and 'key' shall have same dim 1 (sequence length) "
                                 f"unless key has length 0 (shared KV); got {S} and {L}")
        if H % 8:
            raise ValueError(f"head_size must be a multiple of 8. Got head_size % 8 == {H % 8}")
        if H == 0:
            raise ValueError("head_size must be > 0 (query last dimension is 0)")

        # cache element types
        bits = self.kv_cache_bit_width
        if self.quantized:
            cache_dt = np.dtype(np.int8) if bits == 8 else np.dtype(np.uint8)
            Hp = H if bits == 8 else (H + 1) // 2
            ks, k_pc = self._scale(k_scale, "k_scale", self.k_quant_type, Nkv * H)
            vs, v_pc = self._scale(v_scale, "v_scale", self.v_quant_type, Nkv * H)
            ktype = v.quant_type(bits, k_pc)
            vtype = v.quant_type(bits, v_pc)
        else:
            if k_scale is not None or v_scale is not None:
                raise ValueError("k_scale / v_scale must not be given when k_quant_type is NONE")
            cache_dt, Hp = dt, H
            ks = vs = np.ones(1, np.float32)
            k_pc = v_pc = False
            ktype = vtype = _F32 if dt == np.float32 else _F16

        v.array(seqlens_k, "seqlens_k", _INT32)
        if seqlens_k.shape != (B,):
            raise ValueError(f"seqlens_k must be shape (batch_size,) = ({B},), got {seqlens_k.shape}")

        # past / present
        if (past_key is None) != (past_value is None):
            raise ValueError("Input 'past_key' and 'past_value' shall be both present or both absent.")
        has_past = past_key is not None
        Pbuf = 0
        if has_past:
            for name, x in (("past_key", past_key), ("past_value", past_value)):
                v.array(x, name, (cache_dt,), ndim=4)
                want = (B, Nkv, x.shape[2], Hp)
                if x.shape != want:
                    raise ValueError(f"Input '{name}' must have shape (batch_size, kv_num_heads, "
                                     f"past_sequence_length, {'head_size' if Hp == H else '(head_size+1)//2'}) "
                                     f"= ({B}, {Nkv}, *, {Hp}), got {x.shape}")
            if past_key.shape != past_value.shape:
                raise ValueError(f"Input 'past_key' and 'past_value' shall have the same shape; got "
                                 f"{past_key.shape} and {past_value.shape}")
            Pbuf = past_key.shape[2]
        shared = (present_key is not None and present_key is past_key) or \
                 (present_value is not None and present_value is past_value)
        if shared and not (present_key is past_key and present_value is past_value):
            raise ValueError("in-place mode needs present_key is past_key and present_value is past_value")
        if shared:
            for name, x in (("past_key", past_key), ("past_value", past_value)):
                if not (x.flags.c_contiguous and x.flags.aligned and x.flags.writeable):
                    raise ValueError(f"{name} must be C-contiguous, aligned and writeable in "
                                     "in-place mode (present is past)")
            if np.may_share_memory(past_key, past_value):
                raise ValueError("past_key and past_value must not overlap in in-place mode")
        elif (present_key is None) != (present_value is None):
            raise ValueError("present_key and present_value must be given together")
        if L == 0 and not has_past:
            raise ValueError("key/value with sequence length 0 (shared KV) need past_key and past_value")

        # optional inputs
        rot_half = self._rotary(cos_cache, sin_cache, position_ids, dt, B, S, H)
        bias_bb = bias_nb = False
        if attention_bias is not None:
            v.array(attention_bias, "attention_bias", (dt,), ndim=4)
            bb, bn, bs, _ = attention_bias.shape
            if bb not in (1, B) or bn not in (1, N) or bs != S:
                raise ValueError(f"attention_bias must have shape (batch_size or 1, num_heads or 1, "
                                 f"sequence_length, total_sequence_length) = ({B} or 1, {N} or 1, {S}, "
                                 f"T), got {attention_bias.shape}")
            bias_bb, bias_nb = bb == 1, bn == 1
        if head_sink is not None:
            v.array(head_sink, "head_sink", (dt,), ndim=1)
            if head_sink.shape != (N,):
                raise ValueError(f"head_sink must have shape (num_heads,) = ({N},), got {head_sink.shape}")

        alpha = self.scale if self.scale != 0.0 else float(np.float32(1.0) / np.sqrt(np.float32(H)))
        st.B, st.S, st.H, st.L, st.Hp, st.Pbuf = B, S, H, L, Hp, Pbuf
        st.has_past, st.shared, st.packed, st.cache_dt = has_past, shared, packed, cache_dt
        st.ks, st.vs, st.rot_half = ks, vs, rot_half
        row_bytes = Hp * cache_dt.itemsize
        st.consts = _attention.Consts(
            B=B, S=S, N=N, Nkv=Nkv, H=H, L=L, Pbuf=Pbuf, q_tok=D, kv_tok=D if packed else Nkv * H,
            has_past=has_past, shared=shared, ktype=ktype, vtype=vtype, k_rb=row_bytes,
            v_rb=row_bytes, k_pc=k_pc, v_pc=v_pc, alpha=alpha, softcap=self.softcap,
            W=self.local_window_size, causal=bool(self.causal), rot_half=rot_half,
            do_rotary=bool(self.do_rotary == 1 and rot_half), interleaved=self.rotary_interleaved == 1,
            pos_stride=0 if position_ids is None else position_ids.shape[1],
            bias_bb=bias_bb, bias_nb=bias_nb, smooth=self.smooth_softmax == 1,
            qk_mode=self.qk_output, round_half=dt == np.float16)
        return st

    # -- helpers ---------------------------------------------------------------------
    @staticmethod
    def _scale(s, name, qtype, nch):
        if s is None:
            raise ValueError(f"{name} must be provided when {name[0]}_quant_type is not NONE")
        if not isinstance(s, np.ndarray):
            raise TypeError(f"{name} must be a float32 numpy.ndarray, got {type(s).__name__}")
        if s.dtype != np.float32:
            raise TypeError(f"{name} must be float tensor (float32), got {s.dtype}")
        want = nch if qtype == "PER_CHANNEL" else 1
        if s.size != want:
            raise ValueError(f"{name} shape mismatch: expected {want} elements "
                             f"({'kv_num_heads * head_size' if want != 1 else 'per-tensor'}), got {s.size}")
        return v.contiguous(s.reshape(-1)), qtype == "PER_CHANNEL"

    @staticmethod
    def _total_length(t):
        if isinstance(t, (bool, np.bool_)):
            raise TypeError("total_sequence_length must be an int or a one-element int32 array")
        if isinstance(t, numbers.Integral):
            t = int(t)
        elif isinstance(t, np.ndarray):
            if t.dtype != np.int32:
                raise TypeError(f"total_sequence_length must have dtype int32, got {t.dtype}")
            if t.size != 1:
                raise ValueError("total_sequence_length tensor must be of one element, "
                                 f"got shape {t.shape}")
            t = int(t.reshape(-1)[0])
        else:
            raise TypeError("total_sequence_length must be an int or a one-element int32 array, "
                            f"got {type(t).__name__}")
        if t < 1:
            raise ValueError(f"total_sequence_length must be >= 1, got {t}")
        if t > _INT32_MAX:
            raise ValueError(f"total_sequence_length must be <= {_INT32_MAX} (int32), got {t}")
        return t

    def _rotary(self, cos, sin, pos, dt, B, S, H):
        """Static rotary checks; returns rotary_dim / 2 when rotary applies, else 0."""
        if (cos is None) != (sin is None):
            raise ValueError("Input 'cos_cache' and 'sin_cache' shall be both present or both absent.")
        if pos is not None:
            v.array(pos, "position_ids", _INT64, ndim=2)
        if cos is None:
            if self.do_rotary == 1:
                raise ValueError("cos_cache and sin_cache must be provided when do_rotary is true")
            return 0
        v.array(cos, "cos_cache", (dt,), ndim=2)
        v.array(sin, "sin_cache", (dt,), ndim=2)
        if cos.shape != sin.shape:
            raise ValueError(f"cos_cache and sin_cache must have the same shape; got {cos.shape} and {sin.shape}")
        if H % 16:
            raise ValueError(f"head_size shall be a multiple of 16 when rotary caches are given. "
                             f"Got head_size % 16 == {H % 16}")
        half = cos.shape[1]
        if half > (H // 16) * 8 or half % 8 or half == 0:
            raise ValueError(f"cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8; "
                             f"got {half} (head_size {H})")
        if pos is not None:
            if pos.shape[0] != B:
                raise ValueError(f"position_ids dimension 0 must be equal to the batch size, got {pos.shape[0]}")
            if pos.shape[1] < S:
                raise ValueError(f"position_ids dimension 1 must be at least sequence length, got {pos.shape[1]}")
        return half if self.do_rotary == 1 else 0


class _Static:
    """What _static derived from one input signature."""
    __slots__ = ("dt", "B", "S", "H", "L", "Hp", "Pbuf", "has_past", "shared", "packed", "cache_dt",
                 "ks", "vs", "rot_half", "consts")


def _check_seqlens(seqlens, B, S, T, Pres, Pbuf, L, has_past, shared, first_prompt):
    """Every seqlens_k[b] keeps reads and writes inside the buffers; returns max T_b."""
    tmax = 0
    for b, sk in enumerate(seqlens.tolist()):
        if sk < 0 or sk >= Pres:
            raise ValueError(f"seqlens_k[{b}] = {sk} is out of range [0, {Pres})")
        if sk + 1 > T:
            raise ValueError(f"seqlens_k[{b}] = {sk} exceeds total_sequence_length - 1 = {T - 1}")
        if not first_prompt and sk + 1 < S:
            raise ValueError(f"seqlens_k[{b}] = {sk} is too small for sequence_length {S}")
        if has_past and not shared and L != 0 and not first_prompt and sk + 1 - S > Pbuf:
            raise ValueError(f"seqlens_k[{b}] = {sk} requires {sk + 1 - S} past KV rows, which "
                             f"exceeds the past buffer sequence length {Pbuf}.")
        tmax = max(tmax, sk + 1)
    return tmax


def _check_positions(max_pos, pos, seqlens, B, S, T, first_prompt):
    """The rotary rows read must exist in cos/sin (ONNX Runtime's position rules)."""
    if max_pos < T:
        raise ValueError(f"cos_cache dimension 0 shall not be less than total_sequence_length "
                         f"({max_pos} < {T})")
    if first_prompt:
        base = int(pos.reshape(-1)[0]) if pos is not None and pos.size else 0
        if base < 0 or base > max_pos - S:
            raise ValueError(f"position_ids base value {base} with sequence_length {S} exceeds "
                             f"cos/sin cache range [0, {max_pos})")
    elif pos is not None:
        used = pos[:, :S]
        bad = (used < 0) | (used >= max_pos)
        if bad.any():
            b, s = np.argwhere(bad)[0]
            raise ValueError(f"position_ids[{b}, {s}] = {int(used[b, s])} is out of range [0, {max_pos})")
    else:
        for b, sk in enumerate(seqlens.tolist()):
            if sk >= max_pos:
                raise ValueError(f"seqlens_k[{b}] = {sk} is out of range for rotary cache dimension 0 "
                                 f"({max_pos})")


def _f32(x):
    """float32, C-contiguous and aligned copy or view of a float input."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x if x.flags.aligned else x.copy()


def group_query_attention(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
                          total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
                          attention_bias=None, head_sink=None, k_scale=None, v_scale=None, *,
                          num_heads, kv_num_heads, scale=0.0, softcap=0.0, local_window_size=-1,
                          causal=1, do_rotary=0, rotary_interleaved=0, smooth_softmax=-1, qk_output=0,
                          k_quant_type="NONE", v_quant_type="NONE", kv_cache_bit_width=0,
                          present_key=None, present_value=None, num_threads=None):
    """Functional form of :class:`GroupQueryAttention` (inputs in ONNX order and names)."""
    op = GroupQueryAttention(
        num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale, softcap=softcap,
        local_window_size=local_window_size, causal=causal, do_rotary=do_rotary,
        rotary_interleaved=rotary_interleaved, smooth_softmax=smooth_softmax, qk_output=qk_output,
        k_quant_type=k_quant_type, v_quant_type=v_quant_type, kv_cache_bit_width=kv_cache_bit_width)
    return op(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
              sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
              present_key=present_key, present_value=present_value, num_threads=num_threads)
