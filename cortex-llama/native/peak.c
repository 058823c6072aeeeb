// The int8 peak of a core, measured: the instruction cortex's matrix tiles
// are built on, run back to back on the calling thread. /proc/cpuinfo's
// clock is no guide to it: in a VM it is the host's nominal rate (2.6 GHz on
// an Intel Xeon guest whose cores ran vpmaddubsw at 3.55 GHz, two cores
// busy), and a core may lower its clock for 512-bit work.

#include <time.h>

#include "panels.h"

// Independent chains of sums: more than the instruction's latency (5
// cycles) times the two a cycle a core may issue, so only the ports bound
// the loop.
#define PEAK_CHAINS 12
// Instructions of each chain between two looks at the clock.
#define PEAK_ROUNDS 100000

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if CK_X86

// One round: the instruction once on each chain, every chain a variable of
// its own (an array of them stays in memory), and an empty asm that keeps
// each in its register and the loop from being folded.
#    define PEAK_ROUND(round, keep, x, y)                                                                   \
        a0 = round(a0, x, y), a1 = round(a1, x, y), a2 = round(a2, x, y), a3 = round(a3, x, y);        \
        a4 = round(a4, x, y), a5 = round(a5, x, y), a6 = round(a6, x, y), a7 = round(a7, x, y);        \
        a8 = round(a8, x, y), a9 = round(a9, x, y), a10 = round(a10, x, y), a11 = round(a11, x, y);    \
        __asm__ volatile("" : keep(a0), keep(a1), keep(a2), keep(a3), keep(a4), keep(a5), keep(a6),   \
                         keep(a7), keep(a8), keep(a9), keep(a10), keep(a11));

#    define PEAK_LOOP(vec, set1, round, keep)                                                \
        const vec x = set1(3);                                                               \
        const vec y = set1(-2);                                                              \
        vec a0 = set1(0), a1 = set1(1), a2 = set1(2), a3 = set1(3), a4 = set1(4), a5 = set1(5); \
        vec a6 = set1(6), a7 = set1(7), a8 = set1(8), a9 = set1(9), a10 = set1(10), a11 = set1(11); \
        const double start = seconds_now();                                                  \
        double now = start;                                                                  \
        long long rounds = 0;                                                                \
        do {                                                                                 \
            for (int r = 0; r < PEAK_ROUNDS; r++) {                                          \
                PEAK_ROUND(round, keep, x, y)                                                \
            }                                                                                \
            rounds += PEAK_ROUNDS;                                                           \
            now = seconds_now();                                                             \
        } while (now - start < seconds);                                                     \
        return (double)rounds * PEAK_CHAINS / (now - start);

CK_AVX512 static double avx512_per_second(double seconds) {
#    define DPBUSD_ZMM(acc, x, y) _mm512_dpbusd_epi32(acc, x, y)
    PEAK_LOOP(__m512i, _mm512_set1_epi8, DPBUSD_ZMM, "+v")
}

CK_AVX_VNNI static double avx_vnni_per_second(double seconds) {
#    define DPBUSD_YMM(acc, x, y) _mm256_dpbusd_avx_epi32(acc, x, y)
    PEAK_LOOP(__m256i, _mm256_set1_epi8, DPBUSD_YMM, "+x")
}

CK_AVX2 static double avx2_per_second(double seconds) {
    // vpmaddubsw has no accumulator: each chain feeds its result back.
#    define MADDUBS_YMM(acc, x, y) ((void)(y), _mm256_maddubs_epi16(acc, x))
    PEAK_LOOP(__m256i, _mm256_set1_epi8, MADDUBS_YMM, "+x")
}

#endif

double ck_int8_per_second(enum ck_isa isa, double seconds) {
#if CK_X86
    if (!ck_isa_supported(isa)) {
        return 0.0;
    }
    switch (isa) {
        case CK_ISA_AVX512: return 64.0 * avx512_per_second(seconds);
        case CK_ISA_AVX_VNNI: return 32.0 * avx_vnni_per_second(seconds);
        case CK_ISA_AVX2: return 32.0 * avx2_per_second(seconds);
        default: return 0.0;
    }
#else
    (void)isa;
    (void)seconds;
    return 0.0;
#endif
}
