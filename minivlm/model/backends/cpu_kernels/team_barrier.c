/* A barrier for one thread team that spins for a few microseconds, then sleeps. In the engine, libgomp counts more
   threads than cores (a pool for each thread that ever ran a parallel op) and then sleeps at once in its barrier;
   the wake-up costs tens of microseconds on a VM, at each of a decode step's 40 barriers, while the threads of a
   step usually arrive within a few microseconds of each other. Spinning without end was faster on idle cores and
   up to 5x slower when other processes wanted the cores (bench/RESULTS.md, round 7): the spin here is bounded in
   time, so a waiter whose partner lost its core gives its own core back after SPIN_NS. Linux (futex); elsewhere
   OpenMP's own barrier. Included by decode_layer.c. */
#include <stdint.h>
#include <time.h>

#ifndef SPIN_NS
#define SPIN_NS 50000  /* ns a waiter spins before it sleeps */
#endif

typedef struct {
    int arrived, sense, sleepers;  /* touched only through __atomic builtins */
} TeamBarrier;

#if defined(__linux__) && SPIN_NS > 0
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Every thread of the team calls it with its own `sense` (0 at the start of the team); returns when all have. The
   writes before it are visible to every thread after it (release by each arrival, acquire by each waiter). */
static inline void team_wait(TeamBarrier *b, int *sense, int threads) {
    const int mine = *sense = !*sense;
    if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == threads) {  /* the last one releases the others */
        __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->sense, mine, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST))
            syscall(SYS_futex, &b->sense, FUTEX_WAKE_PRIVATE, threads, 0, 0, 0);
        return;
    }
    const int64_t until = now_ns() + SPIN_NS;
    for (int i = 1; __atomic_load_n(&b->sense, __ATOMIC_ACQUIRE) != mine; i++) {
        cpu_relax();
        if (i % 64 == 0 && now_ns() > until) {  /* long enough: sleep until the last one wakes us */
            __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
            while (__atomic_load_n(&b->sense, __ATOMIC_SEQ_CST) != mine)
                syscall(SYS_futex, &b->sense, FUTEX_WAIT_PRIVATE, !mine, 0, 0, 0);
            __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
            return;
        }
    }
}
#else
static inline void team_wait(TeamBarrier *b, int *sense, int threads) {
    (void)b, (void)sense, (void)threads;
#pragma omp barrier
}
#endif
