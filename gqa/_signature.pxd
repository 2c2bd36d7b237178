# Declarations of gqa/_signature.pyx for the other modules (gqa/_steps.pyx, gqa/_function.pyx).

# op_call by position (the operator's __call__, every input and keyword in op_call's order).
cdef object call_op(self, query, key, value, past_key, past_value, seqlens_k,
                    total_sequence_length, cos_cache, sin_cache, position_ids, attention_bias,
                    head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight, past_hp_key,
                    past_hp_value, oscar_rotation_k, oscar_rotation_v, present_key,
                    present_value, present_hp_key, present_hp_value, num_threads, tuple ring=*)

# The call of a KVCache layer: op_call in place, by position (ring: its rollback rows).
cdef object kept_call(op, query, key, value, past_key, past_value, seqlens_k,
                      total_sequence_length, cos_cache, sin_cache, k_scale, v_scale, hp_key,
                      hp_value, rotation_k, rotation_v, num_threads, tuple ring=*)
