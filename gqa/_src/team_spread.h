/*
 * team_spread.h -- keep the threads of one parallel region on different CPUs (no ISA flags;
 * included by gqa/_attention.pyx).
 *
 * Between calls gqa's worker threads sleep (GOMP_SPINCOUNT, gqa/__init__.py).  Linux wakes a
 * sleeping thread on the waker's CPU when that looks cheap ("wake affine"), so after a pause a
 * worker can start its share on the CPU of the thread that woke it and the two then take turns
 * on one core until the load balancer parts them: measured on a 2-vCPU VM, a decode call took
 * 155 us instead of 54 for as long as the calls came with 10-30 ms pauses between them.
 *
 * Contract: the calling thread sets *taken to gqa_cpu_bit() before the region; every other
 * thread of the team calls gqa_team_spread(&taken) first.  A thread whose CPU is already taken
 * binds itself to a CPU of its affinity mask that no thread of the team has claimed, and stays
 * bound there (libgomp keeps its workers from call to call, so this happens about once per
 * worker); the calling thread -- the user's -- is never bound.  Measured (T = 2048, INT8,
 * 48 batches with 0-100 ms pauses, three shapes): batches slower than 1.5x the best fell
 * from 40-81 % to 4-10 %.  What remains is the caller itself woken on the worker's CPU
 * (wake affine again, when it slept at the region's end); OMP_PROC_BIND=true, which binds
 * the caller too, removes it, but every thread pool the caller starts later inherits the
 * caller's one CPU, so gqa leaves that to the user (README).  Threads never
 * move when the CPUs are all taken, on CPUs numbered 64 and above, or where the OS has no
 * per-thread affinity (non-Linux): results never depend on it, only where the work runs.
 */
#ifndef GQA_TEAM_SPREAD_H
#define GQA_TEAM_SPREAD_H

#include <stdint.h>
#if defined(__linux__)
#include <sched.h>
#endif

/* Bit of the CPU the calling thread runs on now (0: unknown or >= 64). */
static inline uint64_t gqa_cpu_bit(void)
{
#if defined(__linux__) && defined(CPU_SET)
    int c = sched_getcpu();
    return c >= 0 && c < 64 ? (uint64_t)1 << c : 0;
#else
    return 0;
#endif
}

static inline void gqa_team_spread(uint64_t *taken)
{
#if defined(__linux__) && defined(CPU_SET)
    uint64_t bit = gqa_cpu_bit();
    if (bit == 0 || !(__atomic_fetch_or(taken, bit, __ATOMIC_RELAXED) & bit))
        return; /* a CPU of its own */
    cpu_set_t allowed, one;   /* CPU_SETSIZE >= 64 */
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return;
    for (int c = 0; c < 64; c++) {
        uint64_t b = (uint64_t)1 << c;
        if (!CPU_ISSET(c, &allowed) || (__atomic_fetch_or(taken, b, __ATOMIC_RELAXED) & b))
            continue; /* not allowed, or claimed (now by us if it was free) */
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        sched_setaffinity(0, sizeof one, &one);
        return;
    }
#else
    (void)taken;
#endif
}

#endif
