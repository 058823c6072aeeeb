// cortex's CPU attention kernel (see attention.h for the contract).
//
// Two passes per work item (one KV head, one block of query rows, all the
// heads of that KV head's group; or the queries of several sequences that
// hold copies of one prompt prefix, whose blocks are converted once for all
// of them, see ck_attention_group):
// 1. Scores. Per block of 16 cells, K is converted from fp16 and transposed
//    once (lane c of row d holds cell c's element d), so a query's 16 scores
//    are dk fused multiply-adds with its elements broadcast; scaled, masked,
//    kept. Blocks masked for every query are skipped, and neither pass
//    goes outside the blocks between the first and last cell any of them
//    sees (live_blocks).
// 2. Softmax and values. Each query's maximum is exact; exp(score - max) is
//    computed 16 at a time, and the values are added cell by cell in cell
//    order (with the softmax's denominator as one more accumulator), so
//    what a query gets depends only on its own cells, in their order.

#include "attention_layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
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

// The queries of n items computed together, with a->isa's kernels (see
// attention_passes.h).
static void attend(const struct ck_attention * a, const struct item * its, int64_t n, int64_t shared,
                   ptrdiff_t k_off, ptrdiff_t v_off, float * scratch) {
#if CK_ATTENTION_X86
    switch (a->isa) {
        case CK_ISA_AVX512: ck_attend_avx512(a, its, n, shared, k_off, v_off, scratch); return;
        case CK_ISA_AVX2:
        case CK_ISA_AVX_VNNI: ck_attend_avx2(a, its, n, shared, k_off, v_off, scratch); return;
        default: break;
    }
#endif
    (void)its, (void)n, (void)shared, (void)k_off, (void)v_off, (void)scratch;
    abort();  // registered only on x86 with AVX2 or AVX-512
}

void ck_attention_item(const struct ck_attention * a, int64_t item, float * scratch) {
    const struct item it = item_of(a, item);
    attend(a, &it, 1, 0, 0, 0, scratch);
}

void ck_attention_group_item(const struct ck_attention * a, const struct ck_attention_group * group, float * scratch) {
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
}

