// The argmax of rows of logits, for greedy rows sampled in the decode graph
// (ggml's ARGMAX on this device): the same rule as cortex's host sampler
// (cortex_sample's argmax), so a greedy row gets the same token wherever it
// is taken. Two passes, as there: the maximum, then the first position
// holding it, which stops there and rereads a row the first pass brought
// into cache.

#include <math.h>

#include "panels.h"

static int32_t first_position_of(const float * x, int64_t from, int64_t n, float value) {
    for (int64_t i = from; i < n; i++) {
        if (x[i] == value) {
            return (int32_t)i;
        }
    }
    return 0;  // every value NaN
}

static int32_t argmax_scalar(const float * x, int64_t n) {
    float best = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        // `>` is false for NaN: NaN is never the maximum.
        best = x[i] > best ? x[i] : best;
    }
    return first_position_of(x, 0, n, best);
}

#if CK_X86
CK_AVX2 static int32_t argmax_avx2(const float * x, int64_t n) {
    // vmaxps returns its second operand when either is NaN: a NaN of x
    // leaves the lane's maximum as it was.
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    float best = -INFINITY;
    for (int l = 0; l < 8; l++) {
        best = lanes[l] > best ? lanes[l] : best;
    }
    for (; i < n; i++) {
        best = x[i] > best ? x[i] : best;
    }
    const __m256 target = _mm256_set1_ps(best);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), target, _CMP_EQ_OQ));
        if (hits != 0) {
            return (int32_t)(j + __builtin_ctz((unsigned)hits));
        }
    }
    return first_position_of(x, j, n, best);
}
#endif

int32_t ck_argmax(enum ck_isa isa, const float * x, int64_t n) {
#if CK_X86
    if (isa != CK_ISA_NONE) {
        return argmax_avx2(x, n);  // AVX-512 machines have AVX2
    }
#endif
    (void)isa;
    return argmax_scalar(x, n);
}
