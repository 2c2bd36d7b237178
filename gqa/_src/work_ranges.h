/*
 * work_ranges.h -- work units handed out with affinity and stealing (no ISA flags; included by
 * gqa/_attention.pyx, called inside OpenMP parallel regions).
 *
 * Units 0 .. n-1 are split into nt contiguous home ranges, range t = [t*n/nt, (t+1)*n/nt).
 * Thread t takes units from the front of its own range, in order; once that range is empty it
 * takes units from the back of the others' (t+1, t+2, ... cyclically).  So with equal cores
 * each thread computes the same units on every call (their cache slices stay in its L2), and a
 * slower core -- common on shared virtual machines -- hands its last units to a faster one
 * instead of making it wait.  Every unit is taken exactly once, whichever thread takes it and
 * whatever the team's actual size (ranges of absent threads are stolen), so results never
 * depend on the schedule as long as a unit's computation does not.
 *
 * A range is one 64-bit word (front index | back end << 32), alone on its 64-byte line, changed
 * only by compare-and-swap: no locks, one uncontended atomic per unit for the owner.
 */
#ifndef GQA_WORK_RANGES_H
#define GQA_WORK_RANGES_H

#include <stdint.h>

typedef struct {
    volatile uint64_t ends; /* low 32 bits: next unit from the front; high 32: one past the last */
    char pad[56];
} gqa_work_range;

#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
static __inline int gqa_cas64(volatile uint64_t *p, uint64_t *expected, uint64_t desired)
{
    uint64_t seen = (uint64_t)_InterlockedCompareExchange64((volatile long long *)p, (long long)desired,
                                                            (long long)*expected);
    if (seen == *expected)
        return 1;
    *expected = seen;
    return 0;
}
#define GQA_LOAD64(p) (*(p))
#else
static inline int gqa_cas64(volatile uint64_t *p, uint64_t *expected, uint64_t desired)
{
    return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
#define GQA_LOAD64(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#endif

/* Home ranges of n units over nt >= 1 threads (r holds nt entries; n < 2^31). */
static inline void gqa_work_ranges_init(gqa_work_range *r, int n, int nt)
{
    for (int t = 0; t < nt; t++) {
        uint64_t lo = (uint64_t)((int64_t)n * t / nt), hi = (uint64_t)((int64_t)n * (t + 1) / nt);
        r[t].ends = lo | hi << 32;
    }
}

/* One unit from range r: from the front (back == 0) or the back; -1 when it is empty. */
static inline int gqa_work_take(gqa_work_range *r, int back)
{
    uint64_t e = GQA_LOAD64(&r->ends);
    for (;;) {
        uint32_t lo = (uint32_t)e, hi = (uint32_t)(e >> 32);
        if (lo >= hi)
            return -1;
        uint64_t next = back ? ((uint64_t)(hi - 1) << 32 | lo) : ((uint64_t)hi << 32 | (lo + 1));
        if (gqa_cas64(&r->ends, &e, next))
            return (int)(back ? hi - 1 : lo);
    }
}

/* The next unit for thread `me` of nt (see the top of this file); -1: none left anywhere. */
static inline int gqa_work_next(gqa_work_range *r, int nt, int me)
{
    int u = me < nt ? gqa_work_take(&r[me], 0) : -1;
    for (int d = 1; u < 0 && d <= nt; d++)
        u = gqa_work_take(&r[(me + d) % nt], 1);
    return u;
}

/* Adds 1 to *count and returns the new value.  Acquire-release: the thread that sees the
 * final count also sees everything the other threads wrote before their increments. */
#if defined(_MSC_VER) && !defined(__clang__)
static __inline int gqa_work_done(int *count)
{
    return (int)_InterlockedIncrement((volatile long *)count); /* long is 32-bit here; full fence */
}
#else
static inline int gqa_work_done(int *count)
{
    return __atomic_add_fetch(count, 1, __ATOMIC_ACQ_REL);
}
#endif

/* Every thread of the current team waits here until all have arrived (an orphaned OpenMP
 * barrier: call it at the same point on every thread of a parallel region).  Cython's prange
 * inside a parallel block is `omp for nowait`, so a loop that others depend on needs this. */
static inline void gqa_team_barrier(void)
{
#ifdef _OPENMP
#pragma omp barrier
#endif
}

#endif
