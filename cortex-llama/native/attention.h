// cortex's CPU attention kernel: ggml's FLASH_ATTN_EXT for F32 queries over
// an F16 KV cache (no ALiBi, soft-capping or sinks), on AVX-512.
//
// A query's result depends only on its own scores and its own unmasked
// cells, taken in cell order: the scores of 16 cells are computed at once
// (each its own dot product, so the blocking does not change it), the
// softmax takes their exact maximum, and the weighted values are summed
// cell by cell in increasing order. So the same sequence gives the same
// attention wherever its cells lie in the cache and whatever else shares
// the batch, unlike llama.cpp's CPU kernel, whose online softmax rescales
// at its 16-cell tile boundaries. Queries that share a KV head (grouped-
// query attention) and a block of rows share each converted block of K
// and V; so do the queries of sequences whose streams hold copies of one
// prompt prefix, for the prefix's cells (ck_attention_group): each block of
// the prefix is read and converted once for all of them instead of once
// per sequence.

#ifndef CORTEX_ATTENTION_H
#define CORTEX_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

struct ck_attention {
    // q: [dk, rows, heads, seqs] floats; k, v: [d, cells, kv_heads, kv_seqs]
    // fp16; mask: [cells, >= rows, mask_heads, mask_seqs] fp16 or NULL;
    // out: [dv, heads, rows, seqs] floats. Strides in bytes, as ggml's nb.
    const void * q;
    const void * k;
    const void * v;
    const void * mask;
    void * out;
    int64_t dk, dv, rows, heads, seqs, cells, kv_heads, kv_seqs, mask_heads, mask_seqs;
    size_t q_nb[4], k_nb[4], v_nb[4], mask_nb[4], out_nb[4];
    float scale;
    enum ck_isa isa;  // the kernels that compute it
};

// Rows of one KV head's queries handled together (with every head of its
// group): larger blocks share more K/V conversion but hold more scores.
#define CK_ATTENTION_ROWS 8

// Work items: (seq, kv head, block of rows), numbered 0..ck_attention_items;
// a sequence's are ck_attention_items_per_seq in a row.
int64_t ck_attention_items(const struct ck_attention * a);
int64_t ck_attention_items_per_seq(const struct ck_attention * a);

// Queries one group's work item holds at most, and so members (sequences of
// one row block each) at most.
#define CK_ATTENTION_GROUP_QUERIES 48
#define CK_ATTENTION_GROUP_SEQS CK_ATTENTION_GROUP_QUERIES

// Sequences whose first `cells` cells are copies of one stream's (a shared
// prompt prefix), with their queries at one KV head: one work item that
// reads the stream's K and V for those cells once for all of them and each
// member's own for the rest. Each member's result is the one its own items
// give, bit for bit (its cells there are copies of the same bytes).
struct ck_attention_group {
    // Bytes from a->k and a->v to the stream's K and V (the place of a
    // sequence at that stream); it need not be one of this attention's.
    ptrdiff_t k_offset, v_offset;
    int64_t cells;  // a multiple of 16
    int64_t g;      // the KV head
    int64_t n;      // members, at most CK_ATTENTION_GROUP_SEQS
    int64_t seqs[CK_ATTENTION_GROUP_SEQS];
};

// Computes a group's item (a->rows at most CK_ATTENTION_ROWS, and
// n * heads / kv_heads * rows at most CK_ATTENTION_GROUP_QUERIES).
void ck_attention_group_item(const struct ck_attention * a, const struct ck_attention_group * group, float * scratch);
// Floats of scratch one thread needs.
size_t ck_attention_scratch_floats(const struct ck_attention * a);
// Computes work item `item` with `scratch` (ck_attention_scratch_floats).
void ck_attention_item(const struct ck_attention * a, int64_t item, float * scratch);
// Whether the kernel takes these sizes (head sizes in 16s up to 256, at
// most 64 query heads per KV head).
bool ck_attention_supported(int64_t dk, int64_t dv, int64_t heads, int64_t kv_heads);

// The same attention computed one query at a time in plain C, for tests.
void ck_attention_reference(const struct ck_attention * a);

// Random Q, K, V and masks of several shapes (grouped heads, several
// sequences, causal and sparse masks): the kernels of `isa` against the
// reference (within float rounding), the same query in two layouts bit for
// bit, and (where `against` is another instruction set, CK_ISA_NONE for
// none) its kernels' results bit for bit; returns the number of failures
// and writes the first into `why`.
int ck_attention_self_check(enum ck_isa isa, enum ck_isa against, char * why, size_t why_len);

#endif
