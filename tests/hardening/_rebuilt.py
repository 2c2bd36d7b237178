"""A copy of the repository built again with other setup.py options (the sanitizers', the
emulated units'), and a part of the suite run against it in a subprocess: the builds of
test_sanitizers.py and test_emulated.py."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# setup.py's options that the copy's build takes only from `build_env`, never from this process
BUILD_OPTIONS = ("GQA_SANITIZE", "GQA_SANITIZE_OPT", "GQA_EMULATE_AMX", "GQA_EMULATE_AVX512", "GQA_NO_OPENMP")


def _ignore(directory, names):
    skip = {"build", "__pycache__", ".hypothesis", ".pytest_cache", "dist", ".git"}
    return [n for n in names if n in skip or n.endswith((".so", ".pyd", ".o"))]


def build(tmp_path_factory, name, build_env, reuse=None, marker=None):
    """The directory of a copy of the tree (gqa/, tests/, setup.py and the project's files)
    built in place with `build_env` added to this environment (LD_PRELOAD and setup.py's
    options removed first).  reuse: a directory to build in (and keep) as <reuse>/<name>,
    where a later run rebuilds only what changed; marker: a string the build's output must
    contain (proof that the options reached the compiler)."""
    try:
        import Cython  # noqa: F401  (setup.py cythonizes)
    except ImportError:
        pytest.fail(f"the {name} build needs Cython (pip install Cython)")
    if reuse:
        tree = os.path.join(reuse, name)
        os.makedirs(tree, exist_ok=True)
    else:
        tree = str(tmp_path_factory.mktemp("rebuilt") / name)
        os.makedirs(tree)
    for sub in ("gqa", "tests"):
        shutil.copytree(os.path.join(ROOT, sub), os.path.join(tree, sub), ignore=_ignore,
                        dirs_exist_ok=True)
    for sub in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        if os.path.exists(os.path.join(ROOT, sub)):
            shutil.copy2(os.path.join(ROOT, sub), tree)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and k not in BUILD_OPTIONS}
    env.update(build_env)
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-j", str(os.cpu_count() or 2)],
                       cwd=tree, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"the {name} build failed:\n" + (r.stdout + r.stderr)[-4000:]
    assert reuse or marker is None or marker in r.stdout + r.stderr, \
        f"the {name} build's commands lack {marker!r}"
    return tree


def simde_found():
    """True when the C compiler finds SIMDe's AVX-512 header (GQA_EMULATE_AVX512 builds on it)."""
    try:
        r = subprocess.run([os.environ.get("CC", "gcc"), "-E", "-x", "c", "-", "-o", os.devnull],
                           input="#include <simde/x86/avx512.h>\n", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def run_suite(tree, env, files, deselect=None, timeout=1200):
    """pytest on `files` in `tree` with `env`: (return code, stdout + stderr, its summary line)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += (["-k", deselect] if deselect else []) + list(files)
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    summary = [line for line in r.stdout.splitlines() if " passed" in line or " failed" in line]
    return r.returncode, r.stdout + r.stderr, summary[-1] if summary else "(no summary)"
