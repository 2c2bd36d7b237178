"""Build gqa: Cython orchestration + one C translation unit per instruction set.

Kernel TUs are compiled here with their own ISA flags (never -march=native) and
linked into the single extension that owns the dispatch table, `gqa._dispatch`;
Cython output and dispatch.c get baseline flags only.  OpenMP is found by a
compile-link-run probe; without it the build still succeeds, single-threaded.

Environment:
  GQA_NO_OPENMP=1          build without OpenMP
  GQA_SANITIZE=address,undefined   build everything with those sanitizers
  GQA_SANITIZE_OPT=-Og     extra flags for a sanitizer build (default: none, i.e. -O3)
  GQA_EMULATE_AMX=1        tests only: the amx unit with its tile instructions stated in portable
                           code (tests/isa/emu_amx.h) and handed out on any CPU with AVX512-BF16,
                           so that the AMX tier runs, slowly, where the CPU has no AMX
  GQA_EMULATE_AVX512=1     tests only: the avx512 path and every unit of it (VNNI, BF16, the AMX
                           tiles) built on SIMDe and tests/isa's emulation headers with the avx2
                           path's flags, the avx2 path's avxvnni unit on emu_avxvnni.h, all handed
                           out on any CPU with AVX2/FMA/F16C: every x86 table runs, slowly, where
                           the CPU has none of them (needs libsimde-dev)
"""
import concurrent.futures
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SRC = os.path.join("gqa", "_src")
HEADERS = [os.path.join(SRC, h) for h in ("gqa_kernels.h", "kernels_common.h", "kernels_group.h",
                                          "kernels_avx512.h", "kernels_s8dot.h", "kernels_s8dot_contract.h",
                                          "kernels_avx2_dot.h", "kernels_avx2_pack.h", "kernels_avx2_hadamard.h",
                                          "kernels_neon_dot.h",
                                          "work_ranges.h", "team_spread.h",
                                          # built again as other units (kernels_avxvnni_*.c, kernels_avx512vnni_gdot.c)
                                          "kernels_avx2_s8dot.c", "kernels_avx2_gdot.c")]
PXI = [os.path.join("gqa", f) for f in ("_prepare.pxi", "_cache_rows.pxi", "_work.pxi")]   # in _attention.pyx

# path name -> (source, gcc/clang flags, a snippet using one intrinsic of the tier)
X86_PATHS = {
    "avx2": ("kernels_avx2.c", ["-mavx2", "-mfma", "-mf16c"],
             "#include <immintrin.h>\nint main(void){__m256 a=_mm256_set1_ps(1.f);"
             "a=_mm256_fmadd_ps(a,a,a);return (int)_mm256_cvtss_f32(a)-2;}"),
    "avx512": ("kernels_avx512.c",
               ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"],
               "#include <immintrin.h>\nint main(void){__m512 a=_mm512_set1_ps(1.f);"
               "a=_mm512_fmadd_ps(a,a,a);return 0;}"),
}
# units of a path beyond its own file (one source or several), each with the path's flags plus
# its own, compiled where the compiler can; the path's file then sees the define and puts the
# unit's entry in its table
X86_UNITS = {"avx2_s8dot": (("kernels_avx2_s8dot.c", "kernels_avx2_gdot.c"), "avx2", [],
                            "GQA_HAVE_AVX2_S8DOT",
                            "#include <immintrin.h>\nint main(void){__m256i a=_mm256_set1_epi16(1);"
                            "a=_mm256_madd_epi16(a,a);return 0;}"),
            # the avx2 path's level 4 again with AVX-VNNI's vpdpwssd: a table of its own
            # (gqa_kernels_avxvnni, kernels_avx2.c), which dispatch.c hands out
            "avxvnni": (("kernels_avxvnni_s8dot.c", "kernels_avxvnni_gdot.c"), "avx2", ["-mavxvnni"],
                        "GQA_HAVE_AVXVNNI",
                        "#include <immintrin.h>\nint main(void){__m256i a=_mm256_set1_epi16(1);"
                        "a=_mm256_dpwssd_avx_epi32(a,a,a);return 0;}"),
            "avx512vnni": (("kernels_avx512vnni.c", "kernels_avx512vnni_gdot.c"), "avx512", ["-mavx512vnni"], "GQA_HAVE_AVX512VNNI",
                            "#include <immintrin.h>\nint main(void){__m512i a=_mm512_set1_epi32(1);"
                            "a=_mm512_dpbusd_epi32(a,a,a);return 0;}"),
            "avx512bf16": (("kernels_avx512bf16.c", "kernels_avx512bf16_dot.c"), "avx512", ["-mavx512bf16"], "GQA_HAVE_AVX512BF16",
                           "#include <immintrin.h>\nint main(void){__m512 a=_mm512_set1_ps(1.f);"
                           "a=_mm512_dpbf16_ps(a,(__m512bh)a,(__m512bh)a);return 0;}"),
            # the AMX unit uses the avx512bf16 unit's packing: its probe needs -mavx512bf16 too
            "amx": (("kernels_amx.c", "kernels_amxint8.c"), "avx512",
                    ["-mamx-tile", "-mamx-bf16", "-mamx-int8", "-mavx512bf16"], "GQA_HAVE_AMX",
                    "#include <immintrin.h>\nint main(void){_tile_zero(0);_tile_dpbf16ps(0,1,2);"
                    "_tile_dpbssd(0,1,2);_tile_dpbusd(0,1,2);_tile_release();return 0;}")}
ARM_PATHS = {"neon": ("kernels_neon.c", [],
                      "#include <arm_neon.h>\nint main(void){float32x4_t a=vdupq_n_f32(1.f);"
                      "a=vfmaq_f32(a,a,a);return (int)vgetq_lane_f32(a,0)-2;}")}
ARM_UNITS = {"neon_s8dot": (("kernels_neon_s8dot.c", "kernels_neon_gdot.c"), "neon", ["-march=armv8.2-a+dotprod"],
                            "GQA_HAVE_NEON_S8DOT",
                            "#include <arm_neon.h>\nint main(void){int32x4_t a=vdupq_n_s32(1);int8x16_t b="
                            "vdupq_n_s8(1);a=vdotq_s32(a,b,b);return vgetq_lane_s32(a,0)-5;}"),
             "neonbf16": ("kernels_neonbf16.c", "neon", ["-march=armv8.2-a+bf16"], "GQA_HAVE_NEONBF16",
                          "#include <arm_neon.h>\nint main(void){float32x4_t a=vdupq_n_f32(0.f);bfloat16x8_t b="
                          "vreinterpretq_bf16_f32(a);a=vbfdotq_f32(a,b,b);return (int)vgetq_lane_f32(a,0);}")}


def _machine():
    m = platform.machine().lower()
    if m in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if m in ("aarch64", "arm64"):
        return "aarch64"
    return m


def _cpus():
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _probe(compiler_cmd, code, flags, run=False):
    """Compile (and link, and optionally run) `code` with `flags`; True on success."""
    tmp = tempfile.mkdtemp(prefix="gqa-probe-")
    try:
        src = os.path.join(tmp, "probe.c")
        exe = os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(code)
        r = subprocess.run(compiler_cmd + [src, "-o", exe] + flags,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode != 0:
            return False
        if run:
            return subprocess.run([exe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


EMULATION_PROBE = ("#define SIMDE_ENABLE_NATIVE_ALIASES\n#include <simde/x86/avx512.h>\n"
                   "int main(void){__m512 a=_mm512_set1_ps(1.f);a=_mm512_fmadd_ps(a,a,a);return 0;}")


def _emulated(path, unit, flags, opt):
    """Flags of a path (unit None) or one of its units under GQA_EMULATE_AVX512: the avx512
    path's -mavx512* and -mamx-* replaced by the avx2 path's flags and the defines that take the
    intrinsics from tests/isa's headers (SIMDe; emu_amx.h for the tiles), the avxvnni unit's
    -mavxvnni by emu_avxvnni.h; `opt` last (-O1: SIMDe's inlined code makes -O3 several times
    slower to build; a sanitizer build's GQA_SANITIZE_OPT).  Other units and paths: unchanged."""
    emu = ["-I" + os.path.join("tests", "isa")] + opt
    if path == "avx512":
        kept = [f for f in flags if not f.startswith(("-mavx512", "-mamx", "-mavx2", "-mfma", "-mf16c"))]
        amx = ["-DGQA_EMULATE_AMX"] if any(f.startswith("-mamx") for f in flags) else []
        return kept + X86_PATHS["avx2"][1] + ["-DGQA_EMULATE_AVX512"] + amx + emu
    if unit == "avxvnni":
        return [f for f in flags if f != "-mavxvnni"] + ["-DGQA_EMULATE_AVXVNNI"] + emu
    return flags


def _emulated_amx(flags):
    """The amx unit's flags for GQA_EMULATE_AMX: its -mamx-* left out (emu_amx.h states the tile
    instructions; the compiler's are never issued), the rest kept."""
    return ([f for f in flags if not f.startswith("-mamx")] +
            ["-DGQA_EMULATE_AMX", "-I" + os.path.join("tests", "isa")])


OPENMP_PROBE = ("#include <omp.h>\n#include <stdio.h>\nint main(void){int n=0;\n"
                "#pragma omp parallel reduction(+:n)\nn+=1;\nreturn n>0?0:1;}")


class BuildExt(build_ext):
    def build_extensions(self):
        cc = self.compiler.compiler_so[:1] if self.compiler.compiler_type != "msvc" else None
        unix = cc is not None
        sanitize = os.environ.get("GQA_SANITIZE", "").strip()
        emulate_amx = os.environ.get("GQA_EMULATE_AMX") == "1" and unix
        emulate_avx512 = os.environ.get("GQA_EMULATE_AVX512") == "1" and unix and _machine() == "x86_64"
        # an undeclared function is an error: the extension links with undefined symbols allowed
        common = (["-O3", "-std=c99", "-fno-strict-aliasing", "-Werror=implicit-function-declaration"]
                  if unix else ["/O2"])
        link_extra = []
        san = []
        if sanitize and unix:
            san = ["-fsanitize=" + sanitize, "-fno-omit-frame-pointer", "-g"]
            # e.g. GQA_SANITIZE_OPT=-Og (the last -O wins): with ASan + UBSan, -O1 takes 4 min
            # on kernels_avx512.c alone (2 vCPU), -Og 36 s
            san += os.environ.get("GQA_SANITIZE_OPT", "").split()
            common += san
            link_extra += san
        emu_opt = [f for f in san if f.startswith("-O")] or ["-O1"]
        omp_compile, omp_link = [], []
        if unix and os.environ.get("GQA_NO_OPENMP") != "1":
            if _probe(cc, OPENMP_PROBE, ["-fopenmp"], run=True):
                omp_compile, omp_link = ["-fopenmp"], ["-fopenmp"]
            else:
                print("gqa: OpenMP not found; building single-threaded", file=sys.stderr)
        self.gqa_openmp = bool(omp_compile)

        arch = _machine()
        paths = X86_PATHS if arch == "x86_64" else ARM_PATHS if arch == "aarch64" else {}
        units = X86_UNITS if arch == "x86_64" else ARM_UNITS if arch == "aarch64" else {}
        compiled = ["scalar"]
        jobs = []          # (source, flags) of every kernel TU, in link order
        units_built = []   # (unit, its define): dispatch.c sees the defines too
        emulated = []      # the paths and units built on portable statements of their instructions
        for name, (src, flags, snippet) in paths.items():
            if not os.path.exists(os.path.join(SRC, src)):
                continue
            if emulate_avx512 and name == "avx512":
                flags, snippet = _emulated(name, None, flags, emu_opt), EMULATION_PROBE
            if unix and not _probe(cc, snippet, flags):
                print(f"gqa: compiler cannot build the {name} path; skipping it", file=sys.stderr)
                continue
            if emulate_avx512 and name == "avx512":
                emulated.append(name)
            defines = []
            for unit, (usrc, upath, uflags, define, usnippet) in units.items():
                if upath != name:
                    continue
                if emulate_avx512 and (name == "avx512" or unit == "avxvnni"):
                    uflags, usnippet = _emulated(name, unit, paths[name][1] + uflags, emu_opt), EMULATION_PROBE
                    uflags = [f for f in uflags if f not in flags]   # the path's own come first
                elif emulate_amx and unit == "amx":
                    uflags, usnippet = _emulated_amx(uflags), units["avx512bf16"][4]
                if unix and not _probe(cc, usnippet, flags + uflags):
                    print(f"gqa: compiler cannot build {unit}; the {name} path goes without it",
                          file=sys.stderr)
                    continue
                if any(f.startswith("-DGQA_EMULATE_") for f in uflags + flags):
                    emulated.append(unit)
                usrcs = (usrc,) if isinstance(usrc, str) else usrc
                jobs += [(os.path.join(SRC, u), common + flags + uflags) for u in usrcs]
                defines.append("-D" + define)
                units_built.append((unit, define))
            jobs.append((os.path.join(SRC, src), common + flags + defines))
            compiled.append(name)
        jobs.append((os.path.join(SRC, "kernels_scalar.c"), common))
        objects = self._compile_kernels(jobs, unix)

        for ext in self.extensions:
            ext.include_dirs += [SRC, np.get_include()]
            ext.extra_compile_args += (["-O3"] if unix else []) + omp_compile + san
            ext.extra_link_args += omp_link + link_extra
            if ext.name == "gqa._dispatch":
                ext.extra_objects = objects
                # relink when only a kernel TU changed (build_ext checks sources + depends)
                ext.depends = list(ext.depends) + objects
                ext.define_macros += [("GQA_HAVE_" + p.upper(), "1") for p in compiled[1:]]
                ext.define_macros += [(define, "1") for _, define in units_built]
                if emulate_amx and ("amx", "GQA_HAVE_AMX") in units_built:
                    ext.define_macros.append(("GQA_EMULATE_AMX", "1"))
                if emulate_avx512:
                    ext.define_macros.append(("GQA_EMULATE_AVX512", "1"))
                ext.define_macros.append(("GQA_COMPILED_PATHS", '"' + ",".join(compiled) + '"'))
                ext.define_macros.append(("GQA_COMPILED_UNITS", '"' + ",".join(u for u, _ in units_built) + '"'))
                ext.define_macros.append(("GQA_EMULATED_UNITS", '"' + ",".join(emulated) + '"'))
                if unix:
                    ext.libraries.append("m")
        super().build_extensions()

    def _compile_kernels(self, jobs, parallel):
        """The kernel TUs' objects, in the jobs' order; with `parallel` (gcc/clang) compiled
        side by side, as many at a time as build_ext's -j or else this process's CPUs, the
        largest sources first (kernels_avx512.c alone takes about half of a serial build)."""
        def one(job):
            src, flags = job
            return self.compiler.compile([src], output_dir=self.build_temp, include_dirs=[SRC],
                                         extra_postargs=flags, depends=HEADERS)
        workers = self.parallel if isinstance(self.parallel, int) and self.parallel > 1 else _cpus()
        workers = min(workers, len(jobs)) if parallel else 1
        if workers <= 1:
            return [o for job in jobs for o in one(job)]
        for o in self.compiler.object_filenames([src for src, _ in jobs], output_dir=self.build_temp):
            os.makedirs(os.path.dirname(o) or ".", exist_ok=True)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            done = {i: pool.submit(one, jobs[i])
                    for i in sorted(range(len(jobs)), key=lambda i: -os.path.getsize(jobs[i][0]))}
            return [o for i in range(len(jobs)) for o in done[i].result()]


def ext(name, *extra_sources):
    return Extension(f"gqa.{name}", [f"gqa/{name}.pyx", *extra_sources], depends=HEADERS + PXI,
                     define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])


extensions = [
    ext("_dispatch", os.path.join(SRC, "dispatch.c")),
    ext("_kernels"),
    ext("_attention"),
    ext("_window"),
    ext("_checks"),
    ext("_plan"),
    ext("_signature"),
    ext("_steps"),
    ext("_function"),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
        compile_time_env={},
        # the .pyx modules side by side (forked workers: Linux only)
        nthreads=_cpus() if sys.platform.startswith("linux") else 0,
    ),
    cmdclass={"build_ext": BuildExt},
)
