// cortex's attention kernel on AVX2 (see attention.c): 16 cells or values
// in two 8-lane registers, each lane computed with the operations the
// AVX-512 file uses, in the same order, so the results are the same bit for
// bit. What differs is the register blocking: 16 registers instead of 32.

#include "attention_layout.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#define CK_ATT __attribute__((target("avx2,fma,f16c")))
#define CK_ATTEND ck_attend_avx2

typedef struct {
    __m256 lo, hi;
} v16;

CK_ATT static inline v16 v16_load(const float * p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
CK_ATT static inline void v16_store(float * p, v16 x) {
    _mm256_storeu_ps(p, x.lo);
    _mm256_storeu_ps(p + 8, x.hi);
}
CK_ATT static inline v16 v16_set1(float x) { return (v16){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
CK_ATT static inline v16 v16_sub(v16 x, v16 y) { return (v16){_mm256_sub_ps(x.lo, y.lo), _mm256_sub_ps(x.hi, y.hi)}; }
CK_ATT static inline v16 v16_mul(v16 x, v16 y) { return (v16){_mm256_mul_ps(x.lo, y.lo), _mm256_mul_ps(x.hi, y.hi)}; }
CK_ATT static inline v16 v16_max(v16 x, v16 y) { return (v16){_mm256_max_ps(x.lo, y.lo), _mm256_max_ps(x.hi, y.hi)}; }
CK_ATT static inline float v16_reduce_max(v16 x) {
    const __m256 m = _mm256_max_ps(x.lo, x.hi);
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_shuffle_ps(r, r, 1));
    return _mm_cvtss_f32(r);
}
CK_ATT static inline bool v16_any_where(v16 x, float value) {
    const __m256 v = _mm256_set1_ps(value);
    return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(x.lo, v, _CMP_NEQ_OQ), _mm256_cmp_ps(x.hi, v, _CMP_NEQ_OQ))) != 0;
}
CK_ATT static inline bool v16_any_finite(v16 x) { return v16_any_where(x, -INFINITY); }
CK_ATT static inline bool v16_any_nonzero(v16 x) { return v16_any_where(x, 0.0f); }
CK_ATT static inline v16 v16_from_half(const uint16_t * h) {
    return (v16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)),
                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 8)))};
}

// exp(x) for x <= 0, 8 at a time: AVX-512's exp16 step for step (its
// scalef(y, n) is y * 2^n, built here from n's exponent bits: n >= -126
// after the clamp, so 2^n is a normal float).
CK_ATT static inline __m256 exp8(__m256 x) {
    const __m256 finite = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(CK_EXP_LOWEST));
    const __m256 n =
        _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(CK_EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(CK_EXP_LN2_HIGH), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(CK_EXP_LN2_LOW), r);
    __m256 p = _mm256_set1_ps(ck_exp_poly[0]);
    for (int i = 1; i < CK_EXP_TERMS; i++) {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ck_exp_poly[i]));
    }
    const __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), finite);
}

CK_ATT static inline v16 exp16(v16 x) { return (v16){exp8(x.lo), exp8(x.hi)}; }

// 16 fp16 mask values of `row` from cell c0 (n of them valid) as floats;
// past n, -inf (and nothing past n is read).
CK_ATT static inline v16 mask16(const uint16_t * row, int64_t c0, int n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 valid_lo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
    const __m256 valid_hi =
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_add_epi32(lane, _mm256_set1_epi32(8))));
    v16 m = v16_set1(0.0f);
    if (row != NULL) {
        uint16_t part[BLOCK] = {0};
        const uint16_t * h = row + c0;
        if (n < BLOCK) {
            memcpy(part, h, sizeof(uint16_t) * (size_t)n);
            h = part;
        }
        m = v16_from_half(h);
    }
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    return (v16){_mm256_blendv_ps(ninf, m.lo, valid_lo), _mm256_blendv_ps(ninf, m.hi, valid_hi)};
}

// Eight rows of eight floats transposed: column d of r[0..7] stored at
// out + d * 16 (eight lanes of a transposed block's row).
CK_ATT static inline __attribute__((always_inline)) void transpose8_store(const __m256 r[8], float * out) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    _mm256_storeu_ps(out + 0 * BLOCK, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(out + 1 * BLOCK, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(out + 2 * BLOCK, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(out + 3 * BLOCK, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(out + 4 * BLOCK, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(out + 5 * BLOCK, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(out + 6 * BLOCK, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(out + 7 * BLOCK, _mm256_permute2f128_ps(s3, s7, 0x31));
}

// The K of n cells (rows `stride` bytes apart from `rows`; past n, zeros),
// dimensions d0..d0+15, converted and stored transposed: kt[d * 16 + c],
// as four 8 x 8 transposes (cells 0-7 or 8-15, dimensions 0-7 or 8-15).
CK_ATT static inline void transpose_k_block(const char * rows, int64_t stride, int n, int64_t d0, float * kt) {
    for (int cells = 0; cells < BLOCK; cells += 8) {
        for (int dims = 0; dims < BLOCK; dims += 8) {
            __m256 r[8];
            for (int c = 0; c < 8; c++) {
                r[c] = cells + c < n ? _mm256_cvtph_ps(_mm_loadu_si128(
                                           (const __m128i *)((const uint16_t *)(rows + (cells + c) * stride) + d0 + dims)))
                                     : _mm256_setzero_ps();
            }
            transpose8_store(r, kt + dims * BLOCK + cells);
        }
    }
}

// Scores of NQ queries (rows of `q`, dk each) over one transposed block:
// each half of the block in turn, each query over d in four interleaved
// partial sums added in AVX-512's order.
CK_ATT static inline __attribute__((always_inline)) void score_block(const float * kt, const float * q, int64_t dk,
                                                                    float * scores, int64_t stride, float scale,
                                                                    const int NQ) {
    for (int half = 0; half < BLOCK; half += 8) {
        __m256 acc[3][4];
        for (int j = 0; j < NQ; j++) {
            for (int i = 0; i < 4; i++) {
                acc[j][i] = _mm256_setzero_ps();
            }
        }
        for (int64_t d = 0; d < dk; d += 4) {
            for (int i = 0; i < 4; i++) {
                const __m256 kv = _mm256_loadu_ps(kt + (d + i) * BLOCK + half);
                for (int j = 0; j < NQ; j++) {
                    acc[j][i] = _mm256_fmadd_ps(_mm256_set1_ps(q[j * dk + d + i]), kv, acc[j][i]);
                }
            }
        }
        for (int j = 0; j < NQ; j++) {
            float * s = scores + j * stride + half;
            const __m256 dot =
                _mm256_add_ps(_mm256_add_ps(acc[j][0], acc[j][1]), _mm256_add_ps(acc[j][2], acc[j][3]));
            _mm256_storeu_ps(s, _mm256_add_ps(_mm256_mul_ps(dot, _mm256_set1_ps(scale)), _mm256_loadu_ps(s)));
        }
    }
}

// W registers of one query's sums (values vf + i * 8, rows dv apart),
// added cell by cell.
CK_ATT static inline __attribute__((always_inline)) void accumulate_slice(const float * vf, int64_t dv, const float * p,
                                                                         float * sums, int n, const int W) {
    __m256 o[8];
    for (int i = 0; i < W; i++) {
        o[i] = _mm256_loadu_ps(sums + i * 8);
    }
    for (int c = 0; c < n; c++) {
        const float w = p[c];
        if (w == 0.0f) {
            continue;  // adds exactly nothing (masked)
        }
        const __m256 wv = _mm256_set1_ps(w);
        for (int i = 0; i < W; i++) {
            o[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(vf + c * dv + i * 8), o[i]);
        }
    }
    for (int i = 0; i < W; i++) {
        _mm256_storeu_ps(sums + i * 8, o[i]);
    }
}

// A block's n cells added to the sums of `rows` queries (weights p, rows
// `stride` apart; sums dv + 16 apart): a query at a time, its values in
// slices of 64 that keep their sums in registers, then its denominator
// (the weights added in cell order, as AVX-512's lanes add them).
CK_ATT static void accumulate_rows(const float * vf, const float * p, int64_t stride, float * sums, int n,
                                   int64_t chunks, int64_t rows) {
    const int64_t dv = chunks * BLOCK;
    for (int64_t j = 0; j < rows; j++) {
        const float * pj = p + j * stride;
        float * acc = sums + j * (dv + BLOCK);
        for (int64_t d0 = 0; d0 < dv; d0 += 64) {
            switch (dv - d0 < 64 ? (dv - d0) / 8 : 8) {
                case 2: accumulate_slice(vf + d0, dv, pj, acc + d0, n, 2); break;
                case 4: accumulate_slice(vf + d0, dv, pj, acc + d0, n, 4); break;
                case 6: accumulate_slice(vf + d0, dv, pj, acc + d0, n, 6); break;
                default: accumulate_slice(vf + d0, dv, pj, acc + d0, n, 8); break;
            }
        }
        float total = acc[dv];
        for (int c = 0; c < n; c++) {
            if (pj[c] != 0.0f) {
                total += pj[c];
            }
        }
        acc[dv] = total;
    }
}

#include "attention_passes.h"

#endif
