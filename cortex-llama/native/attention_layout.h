// What cortex's attention kernel and its check share: the work items and
// where each query, K and V row, mask row and output lives (see
// attention.h).

#ifndef CORTEX_ATTENTION_LAYOUT_H
#define CORTEX_ATTENTION_LAYOUT_H

#include "attention.h"

#include <string.h>

#define BLOCK 16
#define MAX_D 256
#define MAX_GROUP 64
#define MAX_QUERIES (CK_ATTENTION_ROWS * MAX_GROUP)

static inline int64_t row_blocks(const struct ck_attention * a) {
    return (a->rows + CK_ATTENTION_ROWS - 1) / CK_ATTENTION_ROWS;
}

static inline int64_t group_size(const struct ck_attention * a) { return a->heads / a->kv_heads; }

// The query, K, V, mask and output rows of one work item.
struct item {
    int64_t s, g, row0, nrows, ks;
};

static inline struct item item_of(const struct ck_attention * a, int64_t index) {
    struct item it;
    const int64_t blocks = row_blocks(a);
    it.s = index / (a->kv_heads * blocks);
    it.g = (index / blocks) % a->kv_heads;
    it.row0 = (index % blocks) * CK_ATTENTION_ROWS;
    it.nrows = a->rows - it.row0 < CK_ATTENTION_ROWS ? a->rows - it.row0 : CK_ATTENTION_ROWS;
    it.ks = it.s / (a->seqs / a->kv_seqs);
    return it;
}

// Query r of an item: head g * group + r % group, row row0 + r / group.
static inline int64_t head_of(const struct ck_attention * a, const struct item * it, int64_t r) {
    return it->g * group_size(a) + r % group_size(a);
}

static inline int64_t row_of(const struct item * it, int64_t r, int64_t group) { return it->row0 + r / group; }

static inline const uint16_t * mask_row(const struct ck_attention * a, const struct item * it, int64_t head, int64_t row) {
    if (a->mask == NULL) {
        return NULL;
    }
    return (const uint16_t *)((const char *)a->mask + row * a->mask_nb[1] + (head % a->mask_heads) * a->mask_nb[2] +
                              (it->s % a->mask_seqs) * a->mask_nb[3]);
}

// Whether an fp16 mask value lets its cell in: anything but -inf and NaN,
// as the kernels' float test (a lane above -inf) reads it.
static inline bool mask_live(uint16_t h) { return h != 0xFC00u && !((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu)); }

// The 16-cell blocks [*begin, *end) outside which every one of the n mask
// rows (NULL: every cell live) is -inf. The cache's view spans the longest
// stream rounded up (256 cells at a time), so a short sequence's row is
// mostly -inf; the passes skip those blocks instead of reading the mask,
// asking for K and V rows and computing exponentials there. Rows repeat
// (every head of a group reads one): each distinct row is scanned once.
static inline void live_blocks(const uint16_t * const * masks, int64_t n, int64_t cells, int64_t * begin,
                               int64_t * end) {
    int64_t lo = cells, hi = 0;
    const uint16_t * last = NULL;
    for (int64_t r = 0; r < n && !(lo == 0 && hi == cells); r++) {
        const uint16_t * m = masks[r];
        if (m == NULL) {
            lo = 0, hi = cells;
            break;
        }
        if (r > 0 && m == last) {
            continue;
        }
        last = m;
        int64_t first = 0;
        while (first < lo && !mask_live(m[first])) {
            first++;
        }
        if (first < lo) {
            lo = first;
        }
        // Backwards, four cells at a time while all four are -inf (a
        // short sequence's row ends in hundreds of them).
        int64_t stop = cells;
        const uint64_t dead4 = 0xFC00FC00FC00FC00ull;
        uint64_t word;
        while (stop - 4 >= hi && (memcpy(&word, m + stop - 4, sizeof word), word == dead4)) {
            stop -= 4;
        }
        while (stop > hi && !mask_live(m[stop - 1])) {
            stop--;
        }
        if (stop > hi) {
            hi = stop;
        }
    }
    if (lo >= hi) {
        *begin = *end = 0;
        return;
    }
    *begin = lo / BLOCK * BLOCK;
    *end = (hi + BLOCK - 1) / BLOCK * BLOCK;
}

static inline const float * query(const struct ck_attention * a, const struct item * it, int64_t head, int64_t row) {
    return (const float *)((const char *)a->q + row * a->q_nb[1] + head * a->q_nb[2] + it->s * a->q_nb[3]);
}

static inline float * output(const struct ck_attention * a, const struct item * it, int64_t head, int64_t row) {
    return (float *)((char *)a->out + head * a->out_nb[1] + row * a->out_nb[2] + it->s * a->out_nb[3]);
}

static inline const uint16_t * k_row(const struct ck_attention * a, const struct item * it, int64_t cell) {
    return (const uint16_t *)((const char *)a->k + cell * a->k_nb[1] + it->g * a->k_nb[2] + it->ks * a->k_nb[3]);
}

static inline const uint16_t * v_row(const struct ck_attention * a, const struct item * it, int64_t cell) {
    return (const uint16_t *)((const char *)a->v + cell * a->v_nb[1] + it->g * a->v_nb[2] + it->ks * a->v_nb[3]);
}

// exp(x) for x <= 0 as Cephes' expf computes it (~1 ulp): x clamped at
// CK_EXP_LOWEST, n = round(x / ln 2), r = x - n ln 2 (in two parts), then
// 2^n (1 + r + r^2 p(r)) with p's coefficients from the highest power down.
// One set of constants, so every instruction set computes alike.
#define CK_EXP_LOWEST (-87.33654f)
#define CK_EXP_LOG2E 1.44269504088896341f
#define CK_EXP_LN2_HIGH 0.693359375f
#define CK_EXP_LN2_LOW (-2.12194440e-4f)
#define CK_EXP_TERMS 6
static const float ck_exp_poly[CK_EXP_TERMS] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                                                4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

// The kernels of each instruction set (attention_passes.h).
void ck_attend_avx512(const struct ck_attention * a, const struct item * its, int64_t n, int64_t shared,
                      ptrdiff_t k_off, ptrdiff_t v_off, float * scratch);
void ck_attend_avx2(const struct ck_attention * a, const struct item * its, int64_t n, int64_t shared,
                    ptrdiff_t k_off, ptrdiff_t v_off, float * scratch);

#endif
