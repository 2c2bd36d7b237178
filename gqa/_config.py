"""Process-wide settings: the kernel path, flash attention, approximate VNNI, threads.

The implementation choice is a *path* everywhere (scalar, avx2, avx512, neon: the kernel file
suffix, the C symbol suffix, GQA_PATH, ``config(path=)``, the pytest ids and the asv
parameter); ``GQA_KERNEL``, ``config(kernel=)``, ``available_kernels()``, ``active_kernel()``
and the ``kernel`` / ``active_kernel`` keys of get_config() are the earlier spellings, kept as
aliases.

Read once from the environment at import, then changed with `gqa.config(...)`,
which works both as a plain setter and as a context manager that restores the
previous settings on exit.  Settings are process-global (not per thread).
"""
import os

from . import _dispatch


def _process_cpus():
    """CPUs this process may run on: its affinity mask where the OS has one (a container's
    or taskset's CPU set, which OpenMP's default thread count also follows), else all of them."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# The CPU count the decode plan is made for (gqa/_signature.pyx), read once at import.
PLAN_CPUS = _process_cpus()

# changed only in place (_apply): gqa/_signature.pyx keeps a reference to this dict
_settings = {"path": "auto", "flash": True, "approx_vnni": False, "num_threads": None,
             "flash_blocks": None, "decode_splits": None, "accuracy_level": 0, "tiles": True}

# onnxruntime's accuracy_level values (MatMulNBits): 0 unset, 1 float32, 2 float16, 3 bfloat16,
# 4 int8, each the lowest precision a computation may use.  gqa: levels 0-2 float32; levels 3
# and 4 run prompts' flash tiles on bfloat16 tiles where the CPU has them (AMX, else AVX-512
# BF16 dot products; the `tiles` setting allows or picks them); level 4 also runs the
# integer-dot INT8 kernels (AMX INT8, AVX-512 VNNI or AVX2) elsewhere.
ACCURACY_LEVELS = (0, 1, 2, 3, 4)


def available_paths():
    """Path names this CPU can run, best last (always includes 'scalar')."""
    return [p for p in _dispatch.PATH_NAMES if _dispatch.path_runnable(p)]


def available_tiles():
    """Names of the bfloat16 tiles this CPU runs (levels 3-4's prompt tiles), best first:
    "amx", "avx512bf16", "neonbf16"; gqa.config(tiles=name) accepts each."""
    return [n for n in _dispatch.tile_names() if _dispatch.tiles_runnable(n)]


def _best_path():
    order = ("avx512", "avx2", "neon", "scalar")
    return next(p for p in order if _dispatch.path_runnable(p))


def active_path():
    """Name of the path the kernels run on now."""
    return _dispatch.active_path()


def _check_path(name, source):
    if not isinstance(name, str):
        raise TypeError(f"{source} must be a str naming a kernel path, got {type(name).__name__}")
    valid = ("auto",) + _dispatch.PATH_NAMES
    if name not in valid:
        raise ValueError(f"{source}={name!r} is not a kernel path; valid values: {', '.join(valid)}")
    if name != "auto" and not _dispatch.path_runnable(name):
        why = ("was not compiled into this build" if name not in _dispatch.COMPILED_PATHS
               else "needs CPU features this machine lacks")
        raise ValueError(f"{source}={name!r} cannot run here: it {why}; "
                         f"this CPU can run: {', '.join(available_paths())}")
    return name


def _check_threads(n, source):
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{source} must be a positive int or None, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"{source} must be >= 1, got {n}")
    if n > 2 ** 31 - 1:   # passed to the compute as a C int
        raise ValueError(f"{source} must be <= 2147483647, got {n}")
    return n


def _check_level(n, source):
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{source} must be an int, got {type(n).__name__}")
    if n not in ACCURACY_LEVELS:
        raise ValueError(f"{source} must be 0, 1, 2, 3 or 4 (onnxruntime's accuracy_level), got {n}")
    return n


def _check_tiles(v, source):
    """True / False, or the name of tiles this CPU runs (gqa._dispatch.tile_names())."""
    if isinstance(v, bool):
        return v
    if not isinstance(v, str):
        raise TypeError(f"{source} must be a bool or a str naming tiles, got {type(v).__name__}")
    names = _dispatch.tile_names()
    if v not in names:
        raise ValueError(f"{source}={v!r} is not tiles of this build; valid values: True, False"
                         + "".join(f", {n!r}" for n in names))
    if not _dispatch.tiles_runnable(v):
        raise ValueError(f"{source}={v!r} cannot run here: it needs CPU features this machine "
                         f"lacks; this CPU runs: {', '.join(available_tiles()) or 'no tiles'}")
    return v


def _apply(settings):
    _dispatch._set_path(_best_path() if settings["path"] == "auto" else settings["path"])
    _dispatch._set_approx_vnni(settings["approx_vnni"])
    _dispatch._set_tiles(settings["tiles"])
    _settings.update(settings)


class config:
    """Change settings: ``gqa.config(path="avx2")`` or ``with gqa.config(path="scalar"): ...``.

    path          : "auto" | "scalar" | "avx2" | "avx512" | "neon" (``kernel=``: the earlier name)
    flash         : bool; False forces the naive attention path
    flash_blocks  : (query_rows, kv_rows) tile sizes of the flash path, or None (from the L2 size)
    decode_splits : KV chunks of every (batch, KV head) unit in decode (flash decoding; 1: whole
                    units), or None (automatic)
    approx_vnni : bool, opt in to the approximate INT8 per-tensor QK kernel (AVX-512 VNNI)
    accuracy_level : 0-4, the level of operators whose own accuracy_level is 0 and of
                  gqa.qk_gemm / sv_gemm (GQA_ACCURACY_LEVEL; 0-2: float32 products; 3: prompts
                  on bfloat16 tiles where the CPU has them, else float32; 4: as 3, and integer
                  dot products on INT8 / INT4 / per-group codes: AMX INT8, AVX-512 VNNI, AVX2 or
                  NEON sdot; on AVX2 and NEON not the flash prompt's tiles)
    tiles       : bool or a name (GQA_TILES, default True: the best this CPU runs, "amx" then
                  "avx512bf16"; on aarch64 "neonbf16"); False keeps levels 3 and 4 off the tiles; a name picks those
                  tiles (an error where the CPU lacks them)
    num_threads : int >= 1, or None for GQA_NUM_THREADS / OpenMP's default
    """

    def __init__(self, *, path=None, flash=None, approx_vnni=None, num_threads=None,
                 flash_blocks=None, decode_splits=None, kernel=None, accuracy_level=None,
                 tiles=None):
        new = dict(_settings)
        if kernel is not None:
            if path is not None:
                raise TypeError("give path (or its earlier name kernel), not both")
            path, source = kernel, "kernel"
        else:
            source = "path"
        if path is not None:
            new["path"] = _check_path(path, source)
        if flash is not None:
            new["flash"] = bool(flash)
        if approx_vnni is not None:
            new["approx_vnni"] = bool(approx_vnni)
        if flash_blocks is not None:
            ok = (isinstance(flash_blocks, tuple) and len(flash_blocks) == 2 and
                  all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in flash_blocks))
            if not ok:
                raise ValueError(f"flash_blocks must be a tuple (query_rows, kv_rows) of ints >= 1, "
                                 f"got {flash_blocks!r}")
            new["flash_blocks"] = flash_blocks
        if decode_splits is not None:
            new["decode_splits"] = _check_threads(decode_splits, "decode_splits")
        if num_threads is not None:
            new["num_threads"] = _check_threads(num_threads, "num_threads")
        if accuracy_level is not None:
            new["accuracy_level"] = _check_level(accuracy_level, "accuracy_level")
        if tiles is not None:
            new["tiles"] = _check_tiles(tiles, "tiles")
        self._previous = dict(_settings)
        _apply(new)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _apply(self._previous)
        return False


def get_config():
    """The active settings, with the resolved path and thread count, and the CPU count the
    decode plan is made for (`plan_cpus`)."""
    out = dict(_settings)
    out["active_path"] = active_path()
    out["kernel"], out["active_kernel"] = out["path"], out["active_path"]   # earlier names
    out["approx_vnni_effective"] = _dispatch.approx_vnni_effective()
    out["int8_dot_effective"] = _dispatch.int8_dot_effective()   # level 4's kernels run here
    out["int8_dot_unit"] = _dispatch.int8_dot_unit()             # "amx", "avx512vnni", "avxvnni", "avx2", "neon" or None
    out["group_dot_unit"] = _dispatch.group_dot_unit()           # per-group codes: "avx512vnni", "avxvnni", "avx2", "neon" or None
    out["tiles_effective"] = _dispatch.tiles_effective()         # levels 3-4's prompt tiles, or None
    out["effective_num_threads"] = effective_num_threads()
    out["plan_cpus"] = PLAN_CPUS
    return out


def effective_num_threads(num_threads=None):
    """Threads a call uses: the argument, else the configured count, else OpenMP's default."""
    if num_threads is not None:
        return _check_threads(num_threads, "num_threads")
    if _settings["num_threads"] is not None:
        return _settings["num_threads"]
    return max(1, _dispatch.openmp_max_threads())





available_kernels = available_paths   # the earlier names
active_kernel = active_path


def _init_from_env():
    new = dict(_settings)
    for name in ("GQA_PATH", "GQA_KERNEL"):      # GQA_KERNEL: the earlier name
        k = os.environ.get(name)
        if k is not None and k.strip():
            new["path"] = _check_path(k.strip().lower(), name)
            break
    # ONNX Runtime reads exactly "1" for this flag; we accept the same plus the GQA_ name.
    raw = None
    for name in ("GQA_DISABLE_FLASH_ATTENTION", "ORT_GQA_DISABLE_FLASH_ATTENTION"):
        raw = os.environ.get(name)
        if raw is not None:
            v = raw.strip().lower()
            if v not in ("0", "1", "true", "false", "on", "off", "yes", "no", ""):
                raise ValueError(f"environment variable {name}={raw!r} is not a boolean; use 1 or 0")
            new["flash"] = v not in ("1", "true", "on", "yes")
            break
    new["approx_vnni"] = any(os.environ.get(n) == "1" for n in
                             ("GQA_QKGEMM_S8_APPROX_VNNI", "ORT_MLAS_QKGEMM_S8_APPROX_VNNI"))
    raw = os.environ.get("GQA_TILES")
    if raw is not None and raw.strip():
        v = raw.strip().lower()
        if v in ("0", "1", "true", "false", "on", "off", "yes", "no"):
            new["tiles"] = v in ("1", "true", "on", "yes")
        elif v in _dispatch.tile_names():
            new["tiles"] = _check_tiles(v, "environment variable GQA_TILES")
        else:
            raise ValueError(f"environment variable GQA_TILES={raw!r} is neither a boolean (1 or 0) "
                             f"nor tiles of this build ({', '.join(_dispatch.tile_names()) or 'none'})")
    for key, name, check in (("accuracy_level", "GQA_ACCURACY_LEVEL", _check_level),
                             ("num_threads", "GQA_NUM_THREADS", _check_threads)):
        raw = os.environ.get(name)
        if raw is not None and raw.strip():
            try:
                n = int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
            new[key] = check(n, name)
    _apply(new)


_init_from_env()
