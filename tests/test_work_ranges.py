"""gqa/_src/work_ranges.h, the decode scheduler, on its own: a C program built with the
system compiler takes units from the ranges on real OpenMP threads and checks that every
unit is taken exactly once (any range count, team size, unit count), that one thread
alone takes its home range front to back and then every other range back to front, that
one thread finishes each group of parts (gqa_work_done) and sees all their results, and
that gqa_team_barrier holds every thread until all have arrived."""
import os
import shutil
import subprocess

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gqa", "_src")
CC = os.environ.get("CC", "cc").split()

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include "work_ranges.h"

static int fail(const char *what, int n, int nt, int team, int u)
{
    printf("FAIL %s: n=%d ranges=%d team=%d unit=%d\n", what, n, nt, team, u);
    return 1;
}

int main(void)
{
    gqa_work_range r[16];
    int taken[300], order[300];
    /* exactly once, on a real team (smaller, equal or larger than the range count) */
    for (int rep = 0; rep < 40; rep++)
        for (int n = 0; n <= 257; n += (n < 20 ? 1 : 37))
            for (int nt = 1; nt <= 16; nt++)
                for (int team = 1; team <= 4; team++) {
                    for (int u = 0; u < n; u++)
                        taken[u] = 0;
                    gqa_work_ranges_init(r, n, nt);
#pragma omp parallel num_threads(team)
                    {
                        int me = omp_get_thread_num(), u;
                        while ((u = gqa_work_next(r, nt, me)) >= 0) {
                            if (u >= n)
                                abort();
#pragma omp atomic
                            taken[u]++;
                        }
                    }
                    for (int u = 0; u < n; u++)
                        if (taken[u] != 1)
                            return fail("taken once", n, nt, team, u);
                }
    /* one thread: its home range in order, then the others' from their backs */
    for (int n = 0; n <= 40; n++)
        for (int nt = 1; nt <= 16; nt++) {
            int k = 0, u, want = 0;
            gqa_work_ranges_init(r, n, nt);
            while ((u = gqa_work_next(r, nt, 0)) >= 0)
                order[k++] = u;
            if (k != n)
                return fail("count", n, nt, 1, k);
            for (int t = 0; t < nt; t++) {
                int lo = n * t / nt, hi = n * (t + 1) / nt;
                for (int i = 0; i < hi - lo; i++, want++)
                    if (order[want] != (t == 0 ? lo + i : hi - 1 - i))
                        return fail("order", n, nt, 1, want);
            }
        }
    /* gqa_work_done: of a group's P parts, taken on any threads, exactly one taker sees the
       count reach P, and it sees every part's plain store; gqa_team_barrier: a slot each
       thread stores before the barrier is seen by every thread after it */
    enum { NG = 8, NP = 5 };
    static int val[NG][NP], count[NG], finals[NG], marks[4];
    for (int rep = 0; rep < 400; rep++)
        for (int team = 1; team <= 4; team++) {
            int bad = 0;
            for (int g = 0; g < NG; g++) {
                count[g] = finals[g] = 0;
                for (int q = 0; q < NP; q++)
                    val[g][q] = 0;
            }
            gqa_work_ranges_init(r, NG * NP, team);
#pragma omp parallel num_threads(team)
            {
                int me = omp_get_thread_num(), t = omp_get_num_threads(), u;
                while ((u = gqa_work_next(r, team, me)) >= 0) {
                    int g = u % NG, q = u / NG;   /* a group's parts lie in every range */
                    val[g][q] = rep + u + 1;
                    if (gqa_work_done(&count[g]) == NP) {
                        finals[g]++;
                        for (q = 0; q < NP; q++)
                            if (val[g][q] != rep + q * NG + g + 1) {
#pragma omp atomic write
                                bad = 1;
                            }
                    }
                }
                for (volatile int spin = 0; spin < 3000 * me; spin++)
                    ;   /* thread 0 reaches the barrier first */
                marks[me] = rep + 1;
                gqa_team_barrier();
                for (int i = 0; i < t; i++)
                    if (marks[i] != rep + 1) {
#pragma omp atomic write
                        bad = 2;
                    }
            }
            if (bad)
                return fail(bad == 1 ? "work_done sees every part" : "team_barrier", NG * NP, team, team, rep);
            for (int g = 0; g < NG; g++)
                if (finals[g] != 1)
                    return fail("one finisher", NG * NP, team, team, g);
        }
    printf("ok\n");
    return 0;
}
"""


def test_every_unit_is_taken_once_and_home_ranges_come_first(tmp_path):
    if shutil.which(CC[0]) is None:
        pytest.skip(f"no C compiler ({CC[0]}) to build the scheduler check")
    src, exe = tmp_path / "ranges.c", tmp_path / "ranges"
    src.write_text(PROGRAM)
    build = subprocess.run(CC + ["-O2", "-std=c99", "-fopenmp", "-I" + SRC, str(src), "-o", str(exe)],
                           capture_output=True, text=True)
    if build.returncode != 0 and "omp" in build.stderr.lower():
        pytest.skip("the C compiler has no OpenMP: " + build.stderr.strip().splitlines()[-1])
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
