// The two passes of cortex's attention kernel (see attention.c), written
// once over 16-float blocks and included by each instruction set's file
// (attention_avx512.c, attention_avx2.c), which first defines:
//
// - CK_ATT, the target attribute of its functions, and CK_ATTEND, the name
//   of the entry point this file defines;
// - v16 (16 floats) and v16_load, v16_store, v16_set1, v16_sub, v16_mul,
//   v16_max, v16_reduce_max, v16_any_finite (a lane above -inf),
//   v16_any_nonzero, v16_from_half (16 fp16 values), exp16 (exp of each
//   lane <= 0, -inf giving 0) and mask16 (16 mask values as floats, -inf
//   past the n valid ones);
// - transpose_k_block: 16 cells' K of 16 dimensions converted and stored
//   transposed;
// - score_block: the scores of NQ <= 3 queries over a transposed block;
// - accumulate_rows: a block's weighted values added to the sums of some
//   queries, cell by cell.
//
// Every instruction set computes each lane with the same operations in
// the same order, so both give the same result bit for bit (the
// self-check compares them where the CPU runs both).

// Blocks ahead of the one a pass reads whose K or V rows it asks for first.
// llama.cpp's cache holds a cell's KV heads side by side (a row of 1 KiB at
// 8 heads of 64), so a work item, one KV head, reads 128 bytes of every
// 1 KiB: a stride the hardware prefetcher followed too late, and decode over
// 1,000-4,000 cells took twice as long (16 sequences, Llama 3.2 1B's heads,
// 2 cores of Zen 5; 1.45x at 3B's heads of 128). Results do not change.
#define CK_FETCH_BLOCKS 2

// Asks for the rows of the block at cell `ahead` (if any) of `rows`
// (`stride` bytes apart, `bytes` each).
// (Inlined always: a function that only prefetches looks free of effects,
// and GCC drops a call to it.)
static inline __attribute__((always_inline)) void fetch_block(const char * rows, int64_t stride, int64_t bytes, int64_t ahead, int64_t cells) {
    for (int64_t c = ahead; c < ahead + BLOCK && c < cells; c++) {
        for (int64_t b = 0; b < bytes; b += 64) {
            __builtin_prefetch(rows + c * stride + b);
        }
    }
}

// Asks for block `ahead`'s K or V rows (`k`: which) of the streams the
// queries read there, below cell `cells`: the shared prefix's below
// `shared`, else each member's own.
static inline __attribute__((always_inline)) void fetch_ahead(const struct ck_attention * a, const struct item * its, int64_t n, int64_t shared,
                               const char * shared_rows, bool k, int64_t ahead, int64_t cells) {
    const int64_t stride = (int64_t)(k ? a->k_nb[1] : a->v_nb[1]);
    const int64_t bytes = 2 * (k ? a->dk : a->dv);
    if (ahead < shared) {
        fetch_block(shared_rows, stride, bytes, ahead, cells);
        return;
    }
    for (int64_t m = 0; m < n; m++) {
        const char * own = k ? (const char *)k_row(a, &its[m], 0) : (const char *)v_row(a, &its[m], 0);
        fetch_block(own, stride, bytes, ahead, cells);
    }
}

// Scores of queries lo..hi-1 over the block of n cells at c0, K row c of the
// block at kbase + (c0 + c) * k_nb[1]; false (and their scores -inf) when
// every one of them is masked there.
CK_ATT static bool score_queries(const struct ck_attention * a, const char * kbase, int64_t c0, int n, int64_t lo,
                                 int64_t hi, const uint16_t * const * masks, const float * qs, float * scores,
                                 int64_t padded, float * kt) {
    const int64_t dk = a->dk;
    bool any = false;
    for (int64_t r = lo; r < hi; r++) {
        const v16 m = mask16(masks[r], c0, n);
        v16_store(scores + r * padded + c0, m);
        any |= v16_any_finite(m);
    }
    if (!any) {
        return false;  // every query's scores stay -inf here
    }
    for (int64_t d0 = 0; d0 < dk; d0 += BLOCK) {
        transpose_k_block(kbase + c0 * (int64_t)a->k_nb[1], (int64_t)a->k_nb[1], n, d0, kt + d0 * BLOCK);
    }
    // Three queries at a time, each over d in four interleaved partial
    // sums, added in a fixed order: a query's score is the same whichever
    // others share the call.
    for (int64_t r0 = lo; r0 < hi; r0 += 3) {
        float * first = scores + r0 * padded + c0;
        switch (hi - r0 < 3 ? hi - r0 : 3) {
            case 1: score_block(kt, qs + r0 * dk, dk, first, padded, a->scale, 1); break;
            case 2: score_block(kt, qs + r0 * dk, dk, first, padded, a->scale, 2); break;
            default: score_block(kt, qs + r0 * dk, dk, first, padded, a->scale, 3); break;
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
        const v16 p = exp16(v16_sub(v16_load(s), v16_set1(maxima[r])));
        v16_store(s, p);
        any |= v16_any_nonzero(p);
    }
    if (!any) {
        return;
    }
    for (int c = 0; c < n; c++) {
        const uint16_t * vr = (const uint16_t *)(vbase + (c0 + c) * (int64_t)a->v_nb[1]);
        for (int64_t d0 = 0; d0 < dv; d0 += BLOCK) {
            v16_store(vf + c * dv + d0, v16_from_half(vr + d0));
        }
    }
    accumulate_rows(vf, scores + lo * padded + c0, padded, sums + lo * (dv + BLOCK), n, dv / BLOCK, hi - lo);
}

// The queries of n work items of one KV head (`its`, one row block each
// when n > 1), computed together: cells below `shared` (a multiple of 16)
// from the stream whose K and V lie `k_off` and `v_off` bytes from a->k and
// a->v (each member holds a copy of them), once for every query; the rest
// from each member's own stream. A query's operations are the same as
// alone, so its result is too, bit for bit.
CK_ATT void CK_ATTEND(const struct ck_attention * a, const struct item * its, int64_t n, int64_t shared,
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
    const int64_t g = its[0].g;
    const char * shared_k = (const char *)a->k + k_off + g * (int64_t)a->k_nb[2];
    const char * shared_v = (const char *)a->v + v_off + g * (int64_t)a->v_nb[2];
#define OWN_K(m) ((const char *)k_row(a, &its[m], 0))
#define OWN_V(m) ((const char *)v_row(a, &its[m], 0))

    // Only the blocks where some query has a live cell.
    int64_t begin, end;
    live_blocks(masks, R, cells, &begin, &end);
    const int64_t live_cells = end < cells ? end : cells;

    // Pass 1: scores.
    for (int64_t c0 = begin; c0 < live_cells; c0 += BLOCK) {
        const int nc = (int)(cells - c0 < BLOCK ? cells - c0 : BLOCK);
        fetch_ahead(a, its, n, shared, shared_k, true, c0 + CK_FETCH_BLOCKS * BLOCK, live_cells);
        if (c0 < shared) {
            score_queries(a, shared_k, c0, nc, 0, R, masks, qs, scores, padded, kt);
            continue;
        }
        for (int64_t m = 0; m < n; m++) {
            score_queries(a, OWN_K(m), c0, nc, first[m], first[m + 1], masks, qs, scores, padded, kt);
        }
    }

    // Pass 2: weights, then values cell by cell.
    float maxima[MAX_QUERIES];
    for (int64_t r = 0; r < R; r++) {
        v16 mx = v16_set1(-INFINITY);
        for (int64_t c0 = begin; c0 < end; c0 += BLOCK) {
            mx = v16_max(mx, v16_load(scores + r * padded + c0));
        }
        maxima[r] = v16_reduce_max(mx);
        memset(sums + r * (dv + BLOCK), 0, sizeof(float) * (size_t)(dv + BLOCK));
    }
    for (int64_t c0 = begin; c0 < live_cells; c0 += BLOCK) {
        const int nc = (int)(cells - c0 < BLOCK ? cells - c0 : BLOCK);
        fetch_ahead(a, its, n, shared, shared_v, false, c0 + CK_FETCH_BLOCKS * BLOCK, live_cells);
        if (c0 < shared) {
            weigh_queries(a, shared_v, c0, nc, 0, R, maxima, scores, padded, vf, sums);
            continue;
        }
        for (int64_t m = 0; m < n; m++) {
            weigh_queries(a, OWN_V(m), c0, nc, first[m], first[m + 1], maxima, scores, padded, vf, sums);
        }
    }
#undef OWN_K
#undef OWN_V
    for (int64_t m = 0; m < n; m++) {
        for (int64_t r = 0; r < first[m + 1] - first[m]; r++) {
            float * out = output(a, &its[m], head_of(a, &its[m], r), row_of(&its[m], r, group));
            const float * acc = sums + (first[m] + r) * (dv + BLOCK);
            const float total = acc[dv];
            const v16 inv = v16_set1(total == 0.0f ? 0.0f : 1.0f / total);
            for (int64_t d0 = 0; d0 < dv; d0 += BLOCK) {
                v16_store(out + d0, v16_mul(v16_load(acc + d0), inv));
            }
        }
    }
}
