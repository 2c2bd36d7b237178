"""Run a hardening worker script in a subprocess: a crash (signal, abort) becomes a test
failure that names the case it died on, instead of taking pytest down."""
import json
import os
import subprocess
import sys

import gqa

HERE = os.path.dirname(os.path.abspath(__file__))


def gqa_env(extra=None, gqa_root=None):
    """Environment in which the subprocess imports the same gqa as this process."""
    root = gqa_root or os.path.dirname(os.path.dirname(os.path.abspath(gqa.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "2")
    if extra:
        env.update(extra)
    return env


def run_worker(script, args, tmp_path, timeout, env=None, python=None):
    """Run tests/hardening/<script> with `args` plus --progress; returns the JSON summary
    printed on stdout.  On a crash or timeout, fails with the case being run."""
    import pytest
    progress = os.path.join(str(tmp_path), "progress.jsonl")
    cmd = [python or sys.executable, os.path.join(HERE, script)] + list(args) + ["--progress", progress]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or gqa_env(),
                           cwd=str(tmp_path))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script} timed out after {timeout} s; last case: {_last(progress)}")
    if r.returncode != 0:
        pytest.fail(f"{script} {' '.join(args)} died with status {r.returncode} "
                    f"({'signal ' + str(-r.returncode) if r.returncode < 0 else 'error'}) on case:\n"
                    f"{_last(progress)}\nstderr tail:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _last(progress):
    try:
        with open(progress) as f:
            lines = f.read().strip().splitlines()
        return lines[-1] if lines else "(none started)"
    except OSError:
        return "(no progress file)"


def scaled(n):
    """n scaled by the hypothesis profile: its max_examples over the "ci" profile's (so
    `--hypothesis-profile=long` lengthens the fuzzers too, and "sanitize" shortens them)."""
    try:
        from hypothesis import settings
        f = settings.default.max_examples / settings.get_profile("ci").max_examples
    except Exception:  # noqa: BLE001  (no hypothesis, or no "ci" profile)
        f = 1.0
    return max(1, int(n * f))
