// cortex's CPU attention kernel (see attention.h for the contract).
//
// Two passes per work item (one KV head, one block of query rows, all the
// heads of that KV head's group; or the queries of several sequences that
// hold copies of one prompt prefix, whose blocks are converted once for all
// of them, see ck_attention_group):
// 1. Scores. Per block of 16 cells, K is converted from fp16 and transposed
//    once (lane c of row d holds cell c's element d), so a query's 16 scores
//    are dk fused multiply-adds with its elements broadcast; scaled, masked,
//    kept. Blocks masked for every query are skipped.
// 2. Softmax and values. Each query's maximum is exact; exp(score - max) is
//    computed 16 at a time, and the values are added cell by cell in cell
//    order (with the softmax's denominator as one more accumulator), so
//    what a query gets depends only on its own cells, in their order.

#include "attention_layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#    include <immintrin.h>
#    define CK_ATTENTION_X86 1
#endif

bool ck_attention_supported(int64_t dk, int64_t dv, int64_t heads, int64_t kv_heads) {
    return dk > 0 && dv > 0 && dk % BLOCK == 0 && dv % BLOCK == 0 && dk <= MAX_D && dv <= MAX_D &&
           kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= MAX_GROUP;
}

int64_t ck_attention_items_per_seq(const struct ck_attention * a) { return a->kv_heads * row_blocks(a); }

int64_t ck_attention_items(const struct ck_attention * a) { return a->seqs * ck_attention_items_per_seq(a); }

// Per thread: scores and weights (R x cells), K transposed (dk x 16),
// V converted (16 x dv), the queries (R x dk), the sums (R x (dv + 16)),
// for the most queries an item has (a group's included).
size_t ck_attention_scratch_floats(const struct ck_attention * a) {
    const int64_t own = group_size(a) * CK_ATTENTION_ROWS;
    const int64_t r = own > CK_ATTENTION_GROUP_QUERIES ? own : CK_ATTENTION_GROUP_QUERIES;
    const int64_t cells = (a->cells + BLOCK - 1) / BLOCK * BLOCK;
    return (size_t)(r * cells + a->dk * BLOCK + BLOCK * a->dv + r * a->dk + r * (a->dv + BLOCK) + 64);
}

#if CK_ATTENTION_X86

#    define CK_ATT __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

// 16 x 16 floats transposed in four butterfly stages: stage g swaps bit g
// of the row index with bit g of the lane index (permutex2var takes lane
// j < 16 from its first operand, 16 + j from its second).
#    define CK_STAGE(g, lo, hi)                                                    \
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

// exp(x) for x <= 0 (Cephes' single-precision polynomial, ~1 ulp),
// 16 at a time; -inf gives exactly 0.
CK_ATT static inline __m512 exp16(__m512 x) {
    const __mmask16 finite = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
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
                                                                    float * scores, int64_t stride, __m512 scale,
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
        _mm512_storeu_ps(s, _mm512_add_ps(_mm512_mul_ps(dot, scale), m));
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

// Scores of queries lo..hi-1 over the block of n cells at c0, K row c of the
// block at kbase + (c0 + c) * k_nb[1]; false (and their scores -inf) when
// every one of them is masked there.
CK_ATT static bool score_queries(const struct ck_attention * a, const char * kbase, int64_t c0, int n, int64_t lo,
                                 int64_t hi, const uint16_t * const * masks, const float * qs, float * scores,
                                 int64_t padded, float * kt, __m512 scale) {
    const int64_t dk = a->dk;
    bool any = false;
    for (int64_t r = lo; r < hi; r++) {
        const __m512 m = mask16(masks[r], c0, n);
        _mm512_storeu_ps(scores + r * padded + c0, m);
        any |= _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ) != 0;
    }
    if (!any) {
        return false;  // every query's scores stay -inf here
    }
    for (int64_t d0 = 0; d0 < dk; d0 += BLOCK) {
        __m512 rows[BLOCK];
        for (int c = 0; c < BLOCK; c++) {
            rows[c] = c < n ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                  (const __m256i *)((const uint16_t *)(kbase + (c0 + c) * (int64_t)a->k_nb[1]) + d0)))
                            : _mm512_setzero_ps();
        }
        transpose16(rows);
        for (int d = 0; d < BLOCK; d++) {
            _mm512_storeu_ps(kt + (d0 + d) * BLOCK, rows[d]);
        }
    }
    // Three queries at a time, each over d in four interleaved partial
    // sums (twelve independent chains), added in a fixed order: a query's
    // score is the same whichever others share the call.
    for (int64_t r0 = lo; r0 < hi; r0 += 3) {
        float * first = scores + r0 * padded + c0;
        switch (hi - r0 < 3 ? hi - r0 : 3) {
            case 1: score_block(kt, qs + r0 * dk, dk, first, padded, scale, 1); break;
            case 2: score_block(kt, qs + r0 * dk, dk, first, padded, scale, 2); break;
            default: score_block(kt, qs + r0 * dk, dk, first, padded, scale, 3); break;
        }
    }
    return true;
}

// Weights of queries lo..hi-1 over the block of n cells at c0 (their scores
// become exp(score - max)), then the block's values, V row c at vbase +
// (c0 + c) * v_nb[1], added to their sums cell by cell.
CK_ATT static void weigh_queries(const struct ck_attention * a, const char * vbase, int64_t c0, int n, int64_t lo,
                                 int64_t hi, const float * maxima, float * scores, int64_t padded, float * vf,
                                 float * sums) {
    const int64_t dv = a->dv;
    bool any = false;
    for (int64_t r = lo; r < hi; r++) {
        float * s = scores + r * padded + c0;
        if (maxima[r] == -INFINITY) {
            continue;
        }
        const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(s), _mm512_set1_ps(maxima[r])));
        _mm512_storeu_ps(s, p);
        any |= _mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_OQ) != 0;
    }
    if (!any) {
        return;
    }
    for (int c = 0; c < n; c++) {
        const uint16_t * vr = (const uint16_t *)(vbase + (c0 + c) * (int64_t)a->v_nb[1]);
        for (int64_t d0 = 0; d0 < dv; d0 += BLOCK) {
            _mm512_storeu_ps(vf + c * dv + d0, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + d0))));
        }
    }
    const int64_t chunks = dv / BLOCK;
    // Queries whose sums fit in registers together (24 of the 32); each
    // query's sums are its own chains, in cell order, whoever shares the call.
    const int64_t per_group = chunks == 4 ? 4 : chunks == 8 ? 2 : 1;
    for (int64_t r0 = lo; r0 < hi; r0 += per_group) {
        const int nq = (int)(hi - r0 < per_group ? hi - r0 : per_group);
        const float * p = scores + r0 * padded + c0;
        float * acc = sums + r0 * (dv + BLOCK);
        switch (chunks * 8 + nq) {
#    define CK_ACC(ch, q) \
        case (ch) * 8 + (q): accumulate_block(vf, p, padded, acc, n, ch, q); break;
            CK_ACC(4, 1) CK_ACC(4, 2) CK_ACC(4, 3) CK_ACC(4, 4)
            CK_ACC(8, 1) CK_ACC(8, 2)
            CK_ACC(16, 1)
#    undef CK_ACC
            default:
                for (int j = 0; j < nq; j++) {
                    accumulate_any(vf, p + j * padded, acc + j * (dv + BLOCK), n, chunks);
                }
                break;
        }
    }
}

// The queries of n work items of one KV head (`its`, one row block each
// when n > 1), computed together: cells below `shared` (a multiple of 16)
// from the stream whose K and V lie `k_off` and `v_off` bytes from a->k and
// a->v (each member holds a copy of them), once for every query; the rest
// from each member's own stream. A query's operations are the same as
// alone, so its result is too, bit for bit.
CK_ATT static void attend(const struct ck_attention * a, const struct item * its, int64_t n, int64_t shared,
                          ptrdiff_t k_off, ptrdiff_t v_off, float * scratch) {
    const int64_t group = group_size(a);
    int64_t first[CK_ATTENTION_GROUP_SEQS + 1];
    first[0] = 0;
    for (int64_t m = 0; m < n; m++) {
        first[m + 1] = first[m] + group * its[m].nrows;
    }
    const int64_t R = first[n];
    const int64_t dk = a->dk, dv = a->dv;
    const int64_t cells = a->cells;
    const int64_t padded = (cells + BLOCK - 1) / BLOCK * BLOCK;
    float * scores = scratch;                      // R x padded
    float * kt = scores + R * padded;              // dk x 16
    float * vf = kt + dk * BLOCK;                  // 16 x dv
    float * qs = vf + BLOCK * dv;                  // R x dk
    float * sums = qs + R * dk;                    // R x (dv + 16)
    const uint16_t * masks[MAX_QUERIES];
    for (int64_t m = 0; m < n; m++) {
        for (int64_t r = 0; r < first[m + 1] - first[m]; r++) {
            const int64_t head = head_of(a, &its[m], r), row = row_of(&its[m], r, group);
            memcpy(qs + (first[m] + r) * dk, query(a, &its[m], head, row), sizeof(float) * (size_t)dk);
            masks[first[m] + r] = mask_row(a, &its[m], head, row);
        }
    }
    const __m512 scale = _mm512_set1_ps(a->scale);
    const int64_t g = its[0].g;
    const char * shared_k = (const char *)a->k + k_off + g * (int64_t)a->k_nb[2];
    const char * shared_v = (const char *)a->v + v_off + g * (int64_t)a->v_nb[2];
#    define OWN_K(m) ((const char *)k_row(a, &its[m], 0))
#    define OWN_V(m) ((const char *)v_row(a, &its[m], 0))

    // Pass 1: scores.
    for (int64_t c0 = 0; c0 < cells; c0 += BLOCK) {
        const int nc = (int)(cells - c0 < BLOCK ? cells - c0 : BLOCK);
        if (c0 < shared) {
            score_queries(a, shared_k, c0, nc, 0, R, masks, qs, scores, padded, kt, scale);
            continue;
        }
        for (int64_t m = 0; m < n; m++) {
            score_queries(a, OWN_K(m), c0, nc, first[m], first[m + 1], masks, qs, scores, padded, kt, scale);
        }
    }

    // Pass 2: weights, then values cell by cell.
    float maxima[MAX_QUERIES];
    for (int64_t r = 0; r < R; r++) {
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t c0 = 0; c0 < padded; c0 += BLOCK) {
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(scores + r * padded + c0));
        }
        maxima[r] = _mm512_reduce_max_ps(mx);
        memset(sums + r * (dv + BLOCK), 0, sizeof(float) * (size_t)(dv + BLOCK));
    }
    for (int64_t c0 = 0; c0 < cells; c0 += BLOCK) {
        const int nc = (int)(cells - c0 < BLOCK ? cells - c0 : BLOCK);
        if (c0 < shared) {
            weigh_queries(a, shared_v, c0, nc, 0, R, maxima, scores, padded, vf, sums);
            continue;
        }
        for (int64_t m = 0; m < n; m++) {
            weigh_queries(a, OWN_V(m), c0, nc, first[m], first[m + 1], maxima, scores, padded, vf, sums);
        }
    }
#    undef OWN_K
#    undef OWN_V
    for (int64_t m = 0; m < n; m++) {
        for (int64_t r = 0; r < first[m + 1] - first[m]; r++) {
            float * out = output(a, &its[m], head_of(a, &its[m], r), row_of(&its[m], r, group));
            const float * acc = sums + (first[m] + r) * (dv + BLOCK);
            const float total = acc[dv];
            const __m512 inv = _mm512_set1_ps(total == 0.0f ? 0.0f : 1.0f / total);
            for (int64_t d0 = 0; d0 < dv; d0 += BLOCK) {
                _mm512_storeu_ps(out + d0, _mm512_mul_ps(_mm512_loadu_ps(acc + d0), inv));
            }
        }
    }
}

#endif

void ck_attention_item(const struct ck_attention * a, int64_t item, float * scratch) {
#if CK_ATTENTION_X86
    const struct item it = item_of(a, item);
    attend(a, &it, 1, 0, 0, 0, scratch);
#else
    (void)a, (void)item, (void)scratch;
    abort();  // registered only on x86 with AVX-512
#endif
}

void ck_attention_group_item(const struct ck_attention * a, const struct ck_attention_group * group, float * scratch) {
#if CK_ATTENTION_X86
    struct item its[CK_ATTENTION_GROUP_SEQS];
    // More queries than the scratch holds is a planning error: stop rather
    // than write past it.
    if (group->n < 1 || a->rows > CK_ATTENTION_ROWS ||
        group->n * group_size(a) * a->rows > CK_ATTENTION_GROUP_QUERIES) {
        abort();
    }
    for (int64_t m = 0; m < group->n; m++) {
        // Each member's one row block at KV head g.
        its[m] = item_of(a, (group->seqs[m] * a->kv_heads + group->g) * row_blocks(a));
    }
    attend(a, its, group->n, group->cells, group->k_offset, group->v_offset, scratch);
#else
    (void)a, (void)group, (void)scratch;
    abort();
#endif
}

