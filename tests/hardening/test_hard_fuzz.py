"""Hostile and odd-layout calls, thousands of them, in a subprocess (_fuzz_worker.py), so a
crash is reported with the case that caused it.

* invalid: random valid calls mutated (_mutations.py: wrong dtype, off-by-one shapes, ranks,
  negative / huge seqlens_k, inconsistent total_sequence_length, scales of the wrong size or
  dtype, caches of the wrong dtype or packed width, bad present / in-place buffer layouts,
  present buffers aliasing the inputs or each other, bad attributes and thread counts,
  non-arrays, missing inputs).  Each must raise ValueError or TypeError naming the argument
  and leave every caller buffer byte-for-byte unchanged.
* layout: valid calls with inputs non-contiguous, Fortran-ordered, with negative strides,
  read-only or unaligned (np.frombuffer at offset 1): results bit-identical to the
  contiguous call's.

* newer: the surface beyond onnxruntime 1.31.1 (_newer_cases.py, _newer_mutations.py):
  per-group caches, float windows, rotations, QK norm, GroupQueryAttention and
  MixedPrecisionGroupQueryAttention -- window sizes near and past 2^31, window buffers of
  the wrong rows, kind or layout, every buffer the call writes aliasing any other argument,
  non-finite or non-orthogonal rotations, non-finite QK-norm weights and rotary caches,
  per-group attributes and widths, lengths near 2^31.  Refused with ValueError / TypeError,
  caller buffers unchanged, and the canary bytes around every written buffer intact.
* kvcache: gqa.KVCache constructed or used wrongly (_kvcache_mutations.py): refused, its
  buffers and length unchanged (MemoryError allowed for a cache larger than memory).

Repro of a reported case: ``python tests/hardening/_fuzz_worker.py KIND --seed S --only I``.
"""
import pytest

from _subproc import run_worker, scaled

INVALID_CASES = 10000
LAYOUT_CASES = 2000
NEWER_CASES = 6000
KVCACHE_CASES = 3000


def _report(summary):
    lines = []
    for f in summary["failures"]:
        lines.append(f"case {f['i']} ({f.get('mutation', 'layout')}): {f['problems']}\n"
                     f"  repro: python tests/hardening/_fuzz_worker.py {summary['kind']} "
                     f"--seed {summary['seed']} --only {f['i']}")
    return "\n".join(lines)


@pytest.mark.parametrize("seed", [1])
def test_invalid_calls_raise_and_touch_nothing(tmp_path, seed):
    n = scaled(INVALID_CASES)
    s = run_worker("_fuzz_worker.py", ["invalid", "--seed", str(seed), "--count", str(n)], tmp_path,
                   timeout=300)
    assert s["cases"] == n
    assert s["n_failures"] == 0, f"{s['n_failures']} of {n} invalid calls misbehaved:\n" + _report(s)
    # every mutation family was exercised
    assert len(s["by_mutation"]) >= 14 and min(s["by_mutation"].values()) >= 10, s["by_mutation"]


@pytest.mark.parametrize("seed", [1])
def test_odd_layouts_give_identical_results(tmp_path, seed):
    n = scaled(LAYOUT_CASES)
    s = run_worker("_fuzz_worker.py", ["layout", "--seed", str(seed), "--count", str(n)], tmp_path,
                   timeout=300)
    assert s["cases"] == n
    assert s["n_failures"] == 0, f"{s['n_failures']} of {n} valid odd-layout calls differed:\n" + _report(s)


@pytest.mark.parametrize("kind, count", [("newer", NEWER_CASES), ("kvcache", KVCACHE_CASES)])
def test_newer_surface_refuses_and_touches_nothing(tmp_path, kind, count):
    n = scaled(count)
    s = run_worker("_fuzz_worker.py", [kind, "--seed", "1", "--count", str(n)], tmp_path,
                   timeout=300)
    assert s["cases"] == n
    assert s["n_failures"] == 0, f"{s['n_failures']} of {n} {kind} cases misbehaved:\n" + _report(s)
    families = 9 if kind == "newer" else 4
    assert len(s["by_mutation"]) == families and min(s["by_mutation"].values()) >= n // (4 * families), \
        s["by_mutation"]
    assert s["outcomes"].get("raised", 0) >= 0.9 * n, s["outcomes"]   # nearly all invalid
