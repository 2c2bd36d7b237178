# Declarations of gqa/_signature.pyx for the other modules (gqa/_steps.pyx).

# The call of a KVCache layer: op_call in place, by position.
cdef object kept_call(op, query, key, value, past_key, past_value, seqlens_k,
                      total_sequence_length, cos_cache, sin_cache, k_scale, v_scale, hp_key,
                      hp_value, rotation_k, rotation_v, num_threads)
