"""gqa.show_config(): what this build and this machine give."""
import platform
import sys

from . import _config, _dispatch
from ._version import __version__


def show_config(file=None):
    """Print version, compiled paths, CPU features, available and active path,
    OpenMP runtime and thread count."""
    file = file or sys.stdout
    cfg = _config.get_config()
    l2 = _dispatch.l2_cache_bytes()
    lines = [
        f"gqa {__version__}  (Python {platform.python_version()}, {platform.machine()})",
        f"  compiled paths   : {', '.join(_dispatch.COMPILED_PATHS)}",
        f"  compiled units   : {', '.join(_dispatch.COMPILED_UNITS) or 'none'}",
        f"  CPU features     : {', '.join(_dispatch.cpu_features()) or '(none detected)'}",
        *([f"  emulated units   : {', '.join(_dispatch.EMULATED_UNITS)}  (a tests-only build: their "
           "instructions stated in portable code, their features reported wherever the base path runs)"]
          if _dispatch.EMULATED_UNITS else []),
        f"  available paths  : {', '.join(_config.available_paths())}",
        f"  active path      : {cfg['active_path']}  (requested: {cfg['path']})",
        f"  flash attention  : {'on' if cfg['flash'] else 'off (naive path forced)'}",
        f"  approx VNNI QK   : {'on' if cfg['approx_vnni_effective'] else 'off'}"
        f"{' (requested, not runnable here)' if cfg['approx_vnni'] and not cfg['approx_vnni_effective'] else ''}",
        f"  accuracy level   : {cfg['accuracy_level']}  (level 4's int8 kernels "
        f"{'run on ' + cfg['int8_dot_unit'] if cfg['int8_dot_effective'] else 'absent here: float32'}; "
        f"per-group codes: {'on ' + cfg['group_dot_unit'] if cfg['group_dot_unit'] else 'float32'}; "
        f"float caches' prompts: "
        f"{'on codes of each key tile' if _dispatch.float_tile_types_at(4, 64)[0] >= 0 else 'float32 or tiles'})",
        f"  matrix tiles     : {cfg['tiles_effective'] or 'none'}  (levels 3-4's prompt tiles; "
        f"{'off: gqa.config(tiles=False) / GQA_TILES=0' if cfg['tiles'] is False else 'the best here' if cfg['tiles'] is True else 'picked: ' + cfg['tiles']})",
        f"  OpenMP           : {'yes' if _dispatch.openmp_enabled() else 'no (single-threaded build)'}",
        f"  threads          : {cfg['effective_num_threads']}  (decode plan for {cfg['plan_cpus']} CPUs)",
        f"  L2 cache         : {l2 // 1024 if l2 else 'unknown'} KiB",
    ]
    print("\n".join(lines), file=file)
