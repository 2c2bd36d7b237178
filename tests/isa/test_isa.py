"""Every kernel path checked against the scalar reference, including the paths
this CPU cannot run: NEON under qemu-aarch64, AVX-512 (exact and approximate
VNNI) through SIMDe emulation, and natively where the CPU has the ISA.

Each test builds tests/isa/driver.c with kernels_scalar.c and one path's TU
into a temporary directory and runs it (see driver.c for the checks).  Test ids
name the path and how it ran: neon-qemu, neon-dot-qemu (accuracy level 4's sdot unit) and
neonbf16-qemu (the BFDOT tiles of levels 3-4; neon-native, neon-dot-native and neonbf16-native
on aarch64),
avx512-emulated, avx512vnni-emulated, avx512bf16-emulated (the AVX-512 BF16 tiles), amx-emulated,
avx512-native, avx512vnni-native, avx512bf16-native, amx-native, avx2-native, avx2-dot-native
(accuracy level 4's integer dots of the avx2 path), avxvnni-emulated / avxvnni-native (the same
kernels built with AVX-VNNI's vpdpwssd, the table gqa_kernels_avxvnni; emulated: vpdpwssd stated
lane by lane in emu_avxvnni.h); the native ones
exist only where this CPU runs the path (amx-native is listed everywhere and skips, with the
reason, on CPUs without AMX; avx512bf16-native skips without AVX512-BF16); amx-emulated runs the
amx unit's checks in the avx512-emulated build, its tile instructions stated in emu_amx.h.  A test skips otherwise only when the tools it needs are missing (Debian:
gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user; libsimde-dev).
"""
import ast
import concurrent.futures
import os
import platform
import re
import shutil
import subprocess
import tempfile

import pytest

from _objdump import avx512_amx_lines, vpdpwssd_lines

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SRC = os.path.join(ROOT, "gqa", "_src")
DRIVER = os.path.join(HERE, "driver.c")
# -O2 and C99 like the package build (which uses -O3): no FMA contraction of
# separate statements, so the oracle's roundings are the ones written.
CFLAGS = ["-O2", "-std=c99", "-fno-strict-aliasing", "-ffp-contract=off", "-Wall", "-Wno-psabi", "-I" + SRC]
CC = os.environ.get("CC", "cc").split()
APT = "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libsimde-dev"


def _setup_paths():
    """Path name -> (source, flags), and path name -> [(unit sources, its own flags, define, the
    probe snippet)], read from setup.py so the flags have one home."""
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    paths, units = {}, {}
    for node in tree.body:
        name = getattr(node.targets[0], "id", "") if isinstance(node, ast.Assign) else ""
        if name in ("X86_PATHS", "ARM_PATHS"):
            for path, (src, flags, _snippet) in ast.literal_eval(node.value).items():
                paths[path] = (src, flags)
        elif name in ("X86_UNITS", "ARM_UNITS"):
            for src, path, flags, define, snippet in ast.literal_eval(node.value).values():
                units.setdefault(path, []).append(((src,) if isinstance(src, str) else src, flags, define, snippet))
    return paths, units


PATHS, UNITS = _setup_paths()
MACHINE = platform.machine().lower()
X86 = MACHINE in ("x86_64", "amd64")
ARM64 = MACHINE in ("aarch64", "arm64")


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):   # x86 / aarch64
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


CPU = _cpu_flags()
HAS_AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= CPU
HAS_VNNI = HAS_AVX512 and "avx512_vnni" in CPU
HAS_AVX2 = {"avx2", "fma", "f16c"} <= CPU
HAS_AVXVNNI = HAS_AVX2 and "avx_vnni" in CPU
HAS_BF16 = HAS_AVX512 and "avx512_bf16" in CPU
HAS_AMX = HAS_BF16 and {"amx_tile", "amx_bf16", "amx_int8"} <= CPU


def _run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, **kw)
    return r.returncode, r.stdout


def _compile(cmd):
    rc, out = _run(cmd)
    assert rc == 0, "build failed:\n" + " ".join(cmd) + "\n" + out


def _compile_all(cmds):
    """Independent compile commands side by side, one per CPU this process may use."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, cpus)) as pool:
        results = list(pool.map(_run, cmds))
    for cmd, (rc, out) in zip(cmds, results):
        assert rc == 0, "build failed:\n" + " ".join(cmd) + "\n" + out


def _objects(d, cmd, sources, suffix=".o"):
    """(compile commands, objects): each source compiled by `cmd` into d."""
    objs = [os.path.join(d, os.path.basename(src).replace(".c", suffix)) for src in sources]
    return [cmd + ["-c", src, "-o", obj] for src, obj in zip(sources, objs)], objs


class Build:
    """One driver binary, built on first use into a temporary directory."""

    def __init__(self, tmp_factory):
        self.tmp_factory = tmp_factory
        self.cache = {}

    def get(self, key, make):
        if key not in self.cache:
            self.cache[key] = make(str(self.tmp_factory.mktemp(key)))
        return self.cache[key]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    return Build(tmp_path_factory)


_PROBES = {}


def _builds(cc, flags, snippet):
    """True when `cc` compiles the unit's probe snippet with `flags` (setup.py's test: a unit the
    compiler cannot build is left out of the package, and of these drivers)."""
    key = (tuple(cc), tuple(flags), snippet)
    if key not in _PROBES:
        d = tempfile.mkdtemp(prefix="gqa-isa-probe-")
        try:
            src = os.path.join(d, "probe.c")
            with open(src, "w") as f:
                f.write(snippet)
            _PROBES[key] = _run(cc + flags + ["-c", src, "-o", os.path.join(d, "probe.o")])[0] == 0
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return _PROBES[key]


def _units(d, path, flags, cc=None, swap=None):
    """(compile commands, objects) of the path's extra units (setup.py's X86_UNITS / ARM_UNITS)
    that `cc` can build, with `flags` plus their own, and the defines that put them in the
    path's table.  swap: {own flag: flags}: a unit with that flag is built with these in its
    place (the tests' emulation of its ISA; no compiler probe)."""
    cmds, objs, defines = [], [], []
    swap = swap or {}
    for srcs, uflags, define, snippet in UNITS.get(path, []):
        emulated = any(f in swap for f in uflags)
        if emulated:
            uflags = [g for f in uflags for g in swap.get(f, [f])]
        elif not _builds(cc or CC, flags + uflags, snippet):
            continue
        c, o = _objects(d, (cc or CC) + flags + uflags, [os.path.join(SRC, src) for src in srcs])
        cmds += c
        objs += o
        defines.append("-D" + define)
    return cmds, objs, defines


def _driver(d, cc, flags, table, defines, sources, units, link=(), check=None):
    """`d`/driver: driver.c, kernels_scalar.c and `sources` compiled with `flags`, `defines` and
    the table under test (gqa_kernels_<table>), side by side with the units' compile commands
    (`units`: commands, objects); `check(unit objects)` before the link (`link`: its own flags)."""
    exe = os.path.join(d, "driver")
    cmds, objs = _objects(d, cc + flags + defines + ["-DGQA_TEST_TABLE=gqa_kernels_" + table],
                          [DRIVER, os.path.join(SRC, "kernels_scalar.c")] + sources)
    _compile_all(units[0] + cmds)
    if check:
        check(units[1])
    _compile(cc + flags + list(link) + objs + units[1] + ["-o", exe, "-lm"])
    return exe


def _native_driver(d, path):
    src, flags = PATHS[path]
    cmds, objs, defines = _units(d, path, CFLAGS + flags)
    return [_driver(d, CC, CFLAGS + flags, path, defines, [os.path.join(SRC, src)], (cmds, objs))]


def _neon_qemu_driver(d, flags=CFLAGS, static=True):
    """The neon path and its units (sdot and BFDOT: qemu's default CPU has both), built with
    `flags`; static, or dynamic against the cross sysroot (what the sanitizers' runtime needs)."""
    gcc = ["aarch64-linux-gnu-gcc"]
    cmds, objs, defines = _units(d, "neon", flags, gcc)
    exe = _driver(d, gcc, flags, "neon", defines, [os.path.join(SRC, "kernels_neon.c")], (cmds, objs),
                  link=["-static"] if static else [])
    return ["qemu-aarch64"] + ([] if static else ["-L", SYSROOT]) + [exe]


def _no_vpdpwssd(objs):
    for obj in (o for o in objs if os.path.basename(o).startswith("kernels_avxvnni")):
        assert not vpdpwssd_lines(obj), f"the emulated unit {obj} issues vpdpwssd"


def _avxvnni_driver(d, emulated):
    """The avx2 path with its units and the table gqa_kernels_avxvnni under test (level 4's kernels
    built with AVX-VNNI's vpdpwssd); emulated: the avxvnni unit without -mavxvnni, its vpdpwssd
    stated lane by lane (emu_avxvnni.h), checked by objdump to issue none."""
    src, flags = PATHS["avx2"]
    swap = {"-mavxvnni": ["-DGQA_EMULATE_AVXVNNI", "-I" + HERE]} if emulated else None
    cmds, objs, defines = _units(d, "avx2", CFLAGS + flags, swap=swap)
    if "-DGQA_HAVE_AVXVNNI" not in defines:
        pytest.skip("the compiler cannot build the avxvnni unit (-mavxvnni: GCC 11, Clang 12)")
    check = _no_vpdpwssd if emulated and shutil.which("objdump") else None
    return [_driver(d, CC, CFLAGS + flags, "avxvnni", defines, [os.path.join(SRC, src)], (cmds, objs),
                    check=check)]


def _no_evex(objs):
    for o in objs:
        bad = avx512_amx_lines(o)
        assert not bad, f"the emulated unit {o} contains AVX-512 / AMX instructions:\n" + "\n".join(bad[:10])


def _avx512_emulated_driver(d, san=()):
    """kernels_avx512.c and its units on SIMDe: AVX2/FMA/F16C only, like AMD Zen 3; the amx
    unit's tiles on emu_amx.h.  san: sanitizer flags for every object and the link."""
    # -O1: SIMDe's inlined code makes -O2 three times slower to build.
    flags = [f for f in CFLAGS if f != "-O2"] + ["-O1", "-mavx2", "-mfma", "-mf16c",
                                                 "-DGQA_EMULATE_AVX512", "-I" + HERE] + list(san)
    assert not any(f.startswith("-mavx512") for f in flags)
    # the units on SIMDe too: their own -mavx512* / -mamx-* left out, the defines kept; the amx
    # unit also with GQA_EMULATE_AMX (emu_amx.h states the tile instructions)
    cmds, objs, defines = [], [], []
    for usrcs, own, define, _snippet in UNITS.get("avx512", []):
        extra = ["-DGQA_EMULATE_AMX"] if any(f.startswith("-mamx") for f in own) else []
        c, o = _objects(d, CC + flags + extra, [os.path.join(SRC, src) for src in usrcs], "_emu.o")
        cmds, objs = cmds + c, objs + o
        defines.append("-D" + define)
    main, obj = _objects(d, CC + flags + defines, [os.path.join(SRC, "kernels_avx512.c")], "_emu.o")
    return [_driver(d, CC, CFLAGS + list(san), "avx512", [], [], (cmds + main, objs + obj), link=san,
                    check=_no_evex if shutil.which("objdump") else None)]


def _need(*tools):
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (Debian: {APT})")


def _simde():
    _need(CC[0])
    rc, out = _run(CC + ["-E", "-x", "c", "-", "-o", os.devnull], input="#include <simde/x86/avx512.h>\n")
    if rc != 0:
        pytest.skip("SIMDe headers (simde/x86/avx512.h) not found: install libsimde-dev (Debian) to run the emulated AVX-512 path")


def _check(cmd, mode):
    rc, out = _run(cmd + [mode])
    last = out.strip().splitlines()[-1] if out.strip() else ""
    assert rc == 0 and re.search(r": \d+ checks, 0 failed$", last), out
    print(out)


def _cases():
    """(id, driver mode, build) for this host: NEON under qemu on other hosts,
    natively on aarch64; AVX-512 emulated on every x86-64 host, natively too
    where the CPU has it."""
    cases = ([("neon-native", "exact", "neon-native"), ("neon-dot-native", "dot", "neon-native"),
              ("neonbf16-native", "tiles=neonbf16", "neon-native")] if ARM64 else
             [("neon-qemu", "exact", "neon-qemu"), ("neon-dot-qemu", "dot", "neon-qemu"),
              ("neonbf16-qemu", "tiles=neonbf16", "neon-qemu")])
    if X86:
        cases += [("avx512-emulated", "exact", "avx512-emulated"),
                  ("avx512vnni-emulated", "approx", "avx512-emulated")]
        if HAS_AVX512:
            cases.append(("avx512-native", "exact", "avx512-native"))
        if HAS_VNNI:
            cases.append(("avx512vnni-native", "approx", "avx512-native"))
        cases.append(("amx-emulated", "tiles=amx", "avx512-emulated"))
        cases.append(("amx-native", "tiles=amx", "avx512-native"))
        cases.append(("avx512bf16-emulated", "tiles=avx512bf16", "avx512-emulated"))
        if HAS_AVX512:
            cases.append(("avx512bf16-native", "tiles=avx512bf16", "avx512-native"))
        if HAS_AVX2:
            cases.append(("avx2-native", "exact", "avx2-native"))
            cases.append(("avx2-dot-native", "dot", "avx2-native"))
            cases.append(("avxvnni-emulated", "dot", "avxvnni-emulated"))
            if HAS_AVXVNNI:
                cases.append(("avxvnni-native", "dot", "avxvnni-native"))
    return cases


CASES = _cases()


@pytest.mark.parametrize("how,mode,build", CASES, ids=[c[0] for c in CASES])
def test_isa(builds, how, mode, build):
    if build == "neon-qemu":
        _need("aarch64-linux-gnu-gcc", "qemu-aarch64")
        cmd = builds.get(build, _neon_qemu_driver)
    elif build == "neon-native":
        if mode == "tiles=neonbf16" and "bf16" not in CPU:
            pytest.skip("the CPU has no BFloat16 extension (neonbf16-qemu checks these kernels under qemu)")
        cmd = builds.get(build, lambda d: _native_driver(d, "neon"))
    elif build == "avx512-emulated":
        _simde()
        cmd = builds.get(build, _avx512_emulated_driver)
    elif build == "avx512-native":
        if mode == "tiles=amx" and not HAS_AMX:
            pytest.skip("the CPU has no AMX-TILE / AMX-BF16 / AMX-INT8 / AVX512-BF16 (amx-emulated checks these "
                        "kernels)")
        if mode == "tiles=avx512bf16" and not HAS_BF16:
            pytest.skip("the CPU has no AVX512-BF16 (avx512bf16-emulated checks these kernels)")
        cmd = builds.get(build, lambda d: _native_driver(d, "avx512"))
    elif build.startswith("avxvnni-"):
        cmd = builds.get(build, lambda d: _avxvnni_driver(d, build == "avxvnni-emulated"))
    else:
        cmd = builds.get(build, lambda d: _native_driver(d, "avx2"))
    _check(cmd, mode)


SANITIZE = os.environ.get("GQA_SANITIZE_TESTS") == "1" or bool(os.environ.get("CI"))
SYSROOT = "/usr/aarch64-linux-gnu"   # libc6-dev-arm64-cross: qemu's -L for dynamic binaries
# the sanitizer runs' canary: a read past an allocation of a size the compiler does not know
# (UBSan's object-size check would catch a known one)
CANARY = ("#include <stdlib.h>\n"
          "int main(int argc, char **argv){volatile char *p = malloc(7 + argc); return p[7 + argc];}\n")


@pytest.mark.skipif(not SANITIZE, reason="ASan + UBSan of the NEON units under qemu (~2 min): set "
                                         "GQA_SANITIZE_TESTS=1 (on when CI is set)")
def test_neon_units_under_sanitizers(tmp_path):
    """The NEON sdot and BFDOT units, which run in CI only under qemu, built with ASan + UBSan
    (every report fatal) and run through the driver's `dot` and `tiles=neonbf16` checks, whose B
    rows are allocated to their exact size; a canary first shows that ASan reports an
    out-of-bounds read under this qemu, so that "clean" means something."""
    _need("aarch64-linux-gnu-gcc", "qemu-aarch64")
    gcc = ["aarch64-linux-gnu-gcc"]
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g"]
    flags = ["-O1" if f == "-O2" else f for f in CFLAGS] + san
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")   # LeakSanitizer does not run under qemu
    canary = tmp_path / "canary.c"
    canary.write_text(CANARY)
    rc, out = _run(gcc + flags + [str(canary), "-o", str(tmp_path / "canary")])
    if rc != 0:
        pytest.skip(f"the aarch64 cross compiler cannot build with ASan + UBSan here:\n{out[-500:]}")
    rc, out = _run(["qemu-aarch64", "-L", SYSROOT, str(tmp_path / "canary")], env=env)
    if "heap-buffer-overflow" not in out:
        pytest.skip(f"ASan does not report under this qemu (canary: rc {rc}):\n{out[-500:]}")
    cmd = _neon_qemu_driver(str(tmp_path), flags, static=False)
    rc, out = _run(cmd + ["dot", "tiles=neonbf16"], env=env)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    assert rc == 0 and re.search(r": \d+ checks, 0 failed$", last) and "Sanitizer" not in out, out[-3000:]


@pytest.mark.skipif(not SANITIZE, reason="ASan of the emulated AVX-512 and AMX units (~2.5 min): set "
                                         "GQA_SANITIZE_TESTS=1 (on when CI is set)")
@pytest.mark.skipif(not X86, reason="the x86-64 units' emulation build")
def test_emulated_x86_units_under_asan(tmp_path):
    """kernels_avx512.c and its units (VNNI, AVX-512 BF16, AMX) in the emulation build, with
    ASan, through the driver's exact, approx and both tiles' checks.  There every AVX-512 masked
    load and store and every AMX tile load and store is portable code that ASan instruments, where
    GCC's ASan sees neither instruction natively (a masked load made to read all 16 lanes is
    reported, checked once by hand); a canary first shows that ASan reports here.  ASan alone and
    no -g: with UBSan and -g SIMDe's inlined code takes 5 min to build on 2 cores, this 2."""
    _simde()
    san = ["-fsanitize=address"]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    canary = tmp_path / "canary.c"
    canary.write_text(CANARY)
    rc, out = _run(CC + san + [str(canary), "-o", str(tmp_path / "canary")])
    if rc != 0:
        pytest.skip(f"the compiler cannot build with ASan here:\n{out[-500:]}")
    rc, out = _run([str(tmp_path / "canary")], env=env)
    assert "heap-buffer-overflow" in out, f"ASan did not report the canary's overflow (rc {rc}):\n{out[-500:]}"
    cmd = _avx512_emulated_driver(str(tmp_path), san)
    for modes in (["exact", "approx", "tiles=avx512bf16"], ["tiles=amx"]):
        rc, out = _run(cmd + modes, env=env)
        last = out.strip().splitlines()[-1] if out.strip() else ""
        assert rc == 0 and re.search(r": \d+ checks, 0 failed$", last) and "Sanitizer" not in out, out[-3000:]

