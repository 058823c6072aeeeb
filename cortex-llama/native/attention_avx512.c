// cortex's attention kernel on AVX-512 (see attention.c): 16 cells or
// values in the 16 lanes of one register.

#include "attention_layout.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#define CK_ATT __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define CK_ATTEND ck_attend_avx512

typedef __m512 v16;

CK_ATT static inline v16 v16_load(const float * p) { return _mm512_loadu_ps(p); }
CK_ATT static inline void v16_store(float * p, v16 x) { _mm512_storeu_ps(p, x); }
CK_ATT static inline v16 v16_set1(float x) { return _mm512_set1_ps(x); }
CK_ATT static inline v16 v16_sub(v16 x, v16 y) { return _mm512_sub_ps(x, y); }
CK_ATT static inline v16 v16_mul(v16 x, v16 y) { return _mm512_mul_ps(x, y); }
CK_ATT static inline v16 v16_max(v16 x, v16 y) { return _mm512_max_ps(x, y); }
CK_ATT static inline float v16_reduce_max(v16 x) { return _mm512_reduce_max_ps(x); }
CK_ATT static inline bool v16_any_finite(v16 x) {
    return _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ) != 0;
}
CK_ATT static inline bool v16_any_nonzero(v16 x) { return _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NEQ_OQ) != 0; }
CK_ATT static inline v16 v16_from_half(const uint16_t * h) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

// 16 x 16 floats transposed in four butterfly stages: stage g swaps bit g
// of the row index with bit g of the lane index (permutex2var takes lane
// j < 16 from its first operand, 16 + j from its second).
#define CK_STAGE(g, lo, hi)                                                    \
        for (int i = 0; i < 16; i++) {                                             \
            if ((i & (g)) == 0) {                                                  \
                const __m512 x_ = r[i], y_ = r[i + (g)];                            \
                r[i] = _mm512_permutex2var_ps(x_, lo, y_);                          \
                r[i + (g)] = _mm512_permutex2var_ps(x_, hi, y_);                    \
            }                                                                      \
        }

CK_ATT static inline __attribute__((always_inline)) void transpose16(__m512 r[16]) {
    const __m512i lo8 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i hi8 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const __m512i lo4 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i hi4 = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i lo2 = _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    const __m512i hi2 = _mm512_setr_epi32(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    const __m512i lo1 = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i hi1 = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    _Pragma("GCC unroll 16") CK_STAGE(8, lo8, hi8);
    _Pragma("GCC unroll 16") CK_STAGE(4, lo4, hi4);
    _Pragma("GCC unroll 16") CK_STAGE(2, lo2, hi2);
    _Pragma("GCC unroll 16") CK_STAGE(1, lo1, hi1);
}

// exp(x) for x <= 0 (attention_layout.h), 16 at a time; -inf gives
// exactly 0.
CK_ATT static inline __m512 exp16(__m512 x) {
    const __mmask16 finite = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(CK_EXP_LOWEST));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(CK_EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(CK_EXP_LN2_HIGH), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(CK_EXP_LN2_LOW), r);
    __m512 p = _mm512_set1_ps(ck_exp_poly[0]);
    for (int i = 1; i < CK_EXP_TERMS; i++) {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ck_exp_poly[i]));
    }
    const __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(finite, _mm512_scalef_ps(y, n));
}

// 16 fp16 mask values of `row` from cell c0 (n of them valid) as floats;
// past n, -inf.
CK_ATT static inline __m512 mask16(const uint16_t * row, int64_t c0, int n) {
    if (row == NULL) {
        return n == BLOCK ? _mm512_setzero_ps()
                          : _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), (__mmask16)((1u << n) - 1),
                                               _mm512_setzero_ps());
    }
    const __m256i h = _mm256_maskz_loadu_epi16((__mmask16)(n == BLOCK ? 0xFFFF : (1u << n) - 1), row + c0);
    return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), (__mmask16)(n == BLOCK ? 0xFFFF : (1u << n) - 1),
                              _mm512_cvtph_ps(h));
}

// Scores of NQ queries (rows of `q`, dk each) over one transposed block.
CK_ATT static inline __attribute__((always_inline)) void score_block(const float * kt, const float * q, int64_t dk,
                                                                    float * scores, int64_t stride, float scale,
                                                                    const int NQ) {
    __m512 acc[3][4];
    for (int j = 0; j < NQ; j++) {
        for (int i = 0; i < 4; i++) {
            acc[j][i] = _mm512_setzero_ps();
        }
    }
    for (int64_t d = 0; d < dk; d += 4) {
        for (int i = 0; i < 4; i++) {
            const __m512 kv = _mm512_loadu_ps(kt + (d + i) * BLOCK);
            for (int j = 0; j < NQ; j++) {
                acc[j][i] = _mm512_fmadd_ps(_mm512_set1_ps(q[j * dk + d + i]), kv, acc[j][i]);
            }
        }
    }
    for (int j = 0; j < NQ; j++) {
        float * s = scores + j * stride;
        const __m512 m = _mm512_loadu_ps(s);
        const __m512 dot = _mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]), _mm512_add_ps(acc[j][2], acc[j][3]));
        _mm512_storeu_ps(s, _mm512_add_ps(_mm512_mul_ps(dot, _mm512_set1_ps(scale)), m));
    }
}

// Adds the n cells of a block, in order, to the sums of NQ queries: CH
// chunks of 16 values and the denominator each (weights p, rows `stride`
// apart; sums dv + 16 apart).
CK_ATT static inline __attribute__((always_inline)) void accumulate_block(const float * vf, const float * p,
                                                                         int64_t stride, float * sums, int n,
                                                                         const int CH, const int NQ) {
    const int64_t dv = CH * BLOCK;
    __m512 o[4][17];
    for (int j = 0; j < NQ; j++) {
        for (int i = 0; i <= CH; i++) {
            o[j][i] = _mm512_loadu_ps(sums + j * (dv + BLOCK) + i * BLOCK);
        }
    }
    for (int c = 0; c < n; c++) {
        for (int j = 0; j < NQ; j++) {
            const float w = p[j * stride + c];
            if (w == 0.0f) {
                continue;  // adds exactly nothing (masked)
            }
            const __m512 wv = _mm512_set1_ps(w);
            for (int i = 0; i < CH; i++) {
                o[j][i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(vf + c * dv + i * BLOCK), o[j][i]);
            }
            // The denominator rides along as one more sum (p * 1).
            o[j][CH] = _mm512_add_ps(o[j][CH], wv);
        }
    }
    for (int j = 0; j < NQ; j++) {
        for (int i = 0; i <= CH; i++) {
            _mm512_storeu_ps(sums + j * (dv + BLOCK) + i * BLOCK, o[j][i]);
        }
    }
}

// The same for one query and any head size (the same operations in the
// same order, from memory).
CK_ATT static void accumulate_any(const float * vf, const float * p, float * sums, int n, int64_t chunks) {
    const int64_t dv = chunks * BLOCK;
    for (int c = 0; c < n; c++) {
        const float w = p[c];
        if (w == 0.0f) {
            continue;
        }
        const __m512 wv = _mm512_set1_ps(w);
        for (int64_t i = 0; i < chunks; i++) {
            _mm512_storeu_ps(sums + i * BLOCK,
                             _mm512_fmadd_ps(wv, _mm512_loadu_ps(vf + c * dv + i * BLOCK), _mm512_loadu_ps(sums + i * BLOCK)));
        }
        _mm512_storeu_ps(sums + dv, _mm512_add_ps(_mm512_loadu_ps(sums + dv), wv));
    }
}

// The K of n cells (rows `stride` bytes apart from `rows`; past n, zeros),
// dimensions d0..d0+15, converted and stored transposed: kt[d * 16 + c].
CK_ATT static inline void transpose_k_block(const char * rows, int64_t stride, int n, int64_t d0, float * kt) {
    __m512 r[BLOCK];
    for (int c = 0; c < BLOCK; c++) {
        r[c] = c < n ? v16_from_half((const uint16_t *)(rows + c * stride) + d0) : _mm512_setzero_ps();
    }
    transpose16(r);
    for (int d = 0; d < BLOCK; d++) {
        _mm512_storeu_ps(kt + d * BLOCK, r[d]);
    }
}

// A block's n cells added to the sums of `rows` queries (weights p, rows
// `stride` apart; sums dv + 16 apart): as many queries at a time as keep
// their sums in registers (24 of the 32).
CK_ATT static void accumulate_rows(const float * vf, const float * p, int64_t stride, float * sums, int n,
                                   int64_t chunks, int64_t rows) {
    const int64_t dv = chunks * BLOCK;
    const int64_t per_group = chunks == 4 ? 4 : chunks == 8 ? 2 : 1;
    for (int64_t r0 = 0; r0 < rows; r0 += per_group) {
        const int nq = (int)(rows - r0 < per_group ? rows - r0 : per_group);
        const float * pr = p + r0 * stride;
        float * acc = sums + r0 * (dv + BLOCK);
        switch (chunks * 8 + nq) {
#define CK_ACC(ch, q) \
    case (ch) * 8 + (q): accumulate_block(vf, pr, stride, acc, n, ch, q); break;
            CK_ACC(4, 1) CK_ACC(4, 2) CK_ACC(4, 3) CK_ACC(4, 4)
            CK_ACC(8, 1) CK_ACC(8, 2)
            CK_ACC(16, 1)
#undef CK_ACC
            default:
                for (int j = 0; j < nq; j++) {
                    accumulate_any(vf, pr + j * stride, acc + j * (dv + BLOCK), n, chunks);
                }
                break;
        }
    }
}

#include "attention_passes.h"

#endif
