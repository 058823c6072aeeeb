// cortex's attention kernel checked (see attention.h): a reference one
// query at a time in doubles, and random layouts against it, including the
// same sequence at another place in the cache, bit for bit.

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_layout.h"
#include "fp16.h"

void ck_attention_reference(const struct ck_attention * a) {
    const int64_t group = a->heads / a->kv_heads;
    float * s = malloc(sizeof(float) * (size_t)a->cells);
    double * o = malloc(sizeof(double) * (size_t)a->dv);
    for (int64_t seq = 0; seq < a->seqs; seq++) {
        for (int64_t head = 0; head < a->heads; head++) {
            for (int64_t row = 0; row < a->rows; row++) {
                struct item it = {seq, head / group, row, 1, seq / (a->seqs / a->kv_seqs)};
                const float * q = query(a, &it, head, row);
                const uint16_t * mrow = mask_row(a, &it, head, row);
                float max = -INFINITY;
                for (int64_t c = 0; c < a->cells; c++) {
                    const float m = mrow ? ck_fp16_to_fp32(mrow[c]) : 0.0f;
                    if (m == -INFINITY) {
                        s[c] = -INFINITY;
                        continue;
                    }
                    double dot = 0;
                    const uint16_t * kr = k_row(a, &it, c);
                    for (int64_t d = 0; d < a->dk; d++) {
                        dot += (double)q[d] * ck_fp16_to_fp32(kr[d]);
                    }
                    s[c] = (float)(dot * a->scale) + m;
                    max = s[c] > max ? s[c] : max;
                }
                double total = 0;
                memset(o, 0, sizeof(double) * (size_t)a->dv);
                for (int64_t c = 0; c < a->cells && max != -INFINITY; c++) {
                    if (s[c] == -INFINITY) {
                        continue;
                    }
                    const double p = exp((double)s[c] - max);
                    total += p;
                    const uint16_t * vr = v_row(a, &it, c);
                    for (int64_t d = 0; d < a->dv; d++) {
                        o[d] += p * ck_fp16_to_fp32(vr[d]);
                    }
                }
                float * out = output(a, &it, head, row);
                for (int64_t d = 0; d < a->dv; d++) {
                    out[d] = total == 0 ? 0.0f : (float)(o[d] / total);
                }
            }
        }
    }
    free(o);
    free(s);
}

static uint32_t next(uint64_t * state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*state >> 33);
}

static float unit(uint64_t * state) { return (float)next(state) / 2147483648.0f - 1.0f; }

struct layout {
    float * q;
    uint16_t * k;
    uint16_t * v;
    uint16_t * mask;
    float * out;
    struct ck_attention a;
};

// A layout of `seqs` sequences of `rows` queries over `cells` cells, the
// sequence's own `len` cells starting at `offset` (the rest random and
// masked), causal within them.
static struct layout make_layout(int64_t dk, int64_t dv, int64_t heads, int64_t kv_heads, int64_t seqs,
                                 int64_t rows, int64_t cells, int64_t len, int64_t offset, uint64_t seed,
                                 uint64_t noise_seed) {
    struct layout l;
    struct ck_attention * a = &l.a;
    memset(a, 0, sizeof *a);
    a->dk = dk, a->dv = dv, a->rows = rows, a->heads = heads, a->seqs = seqs, a->cells = cells;
    a->kv_heads = kv_heads, a->kv_seqs = seqs, a->mask_heads = 1, a->mask_seqs = seqs;
    a->scale = 1.0f / sqrtf((float)dk);
    l.q = malloc(sizeof(float) * (size_t)(dk * rows * heads * seqs));
    l.k = malloc(2 * (size_t)(dk * cells * kv_heads * seqs));
    l.v = malloc(2 * (size_t)(dv * cells * kv_heads * seqs));
    l.mask = malloc(2 * (size_t)(cells * rows * seqs));
    l.out = calloc((size_t)(dv * heads * rows * seqs), sizeof(float));
    uint64_t state = seed, noise = noise_seed;
    for (int64_t i = 0; i < dk * rows * heads * seqs; i++) {
        l.q[i] = unit(&state) * 2.0f;
    }
    for (int64_t s = 0; s < seqs; s++) {
        for (int64_t g = 0; g < kv_heads; g++) {
            for (int64_t c = 0; c < cells; c++) {
                const bool own = c >= offset && c < offset + len;
                uint64_t * src = own ? &state : &noise;
                for (int64_t d = 0; d < dk; d++) {
                    l.k[((s * kv_heads + g) * cells + c) * dk + d] = ck_fp32_to_fp16(unit(src) * 1.5f);
                }
                for (int64_t d = 0; d < dv; d++) {
                    l.v[((s * kv_heads + g) * cells + c) * dv + d] = ck_fp32_to_fp16(unit(src));
                }
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cells; c++) {
                // Causal over the sequence's own cells: row r sees the first
                // len - rows + r + 1 of them.
                const int64_t visible = len - rows + r + 1;
                const bool seen = c >= offset && c < offset + visible;
                l.mask[(s * rows + r) * cells + c] = seen ? 0 : 0xFC00;  // 0 or -inf
            }
        }
    }
    a->q = l.q, a->k = l.k, a->v = l.v, a->mask = l.mask, a->out = l.out;
    a->q_nb[1] = sizeof(float) * (size_t)dk, a->q_nb[2] = a->q_nb[1] * (size_t)rows, a->q_nb[3] = a->q_nb[2] * (size_t)heads;
    a->k_nb[1] = 2 * (size_t)dk, a->k_nb[2] = a->k_nb[1] * (size_t)cells, a->k_nb[3] = a->k_nb[2] * (size_t)kv_heads;
    a->v_nb[1] = 2 * (size_t)dv, a->v_nb[2] = a->v_nb[1] * (size_t)cells, a->v_nb[3] = a->v_nb[2] * (size_t)kv_heads;
    a->mask_nb[1] = 2 * (size_t)cells, a->mask_nb[2] = a->mask_nb[1] * (size_t)rows, a->mask_nb[3] = a->mask_nb[2];
    a->out_nb[1] = sizeof(float) * (size_t)dv, a->out_nb[2] = a->out_nb[1] * (size_t)heads,
    a->out_nb[3] = a->out_nb[2] * (size_t)rows;
    return l;
}

static void free_layout(struct layout * l) {
    free(l->q), free(l->k), free(l->v), free(l->mask), free(l->out);
}

static void run_all(const struct ck_attention * a) {
    float * scratch = malloc(sizeof(float) * ck_attention_scratch_floats(a));
    for (int64_t i = 0; i < ck_attention_items(a); i++) {
        ck_attention_item(a, i, scratch);
    }
    free(scratch);
}

// Sequences that hold copies of another's first `shared` cells, computed
// as groups reading that one's cells: every member's output must equal its
// own items' bit for bit. The last sequence is the source, the others the
// members (in groups of at most what one item holds).
static int check_groups(enum ck_isa isa, int64_t dk, int64_t heads, int64_t kv_heads, int64_t seqs, int64_t rows,
                        int64_t cells, int64_t len, int64_t shared, uint64_t seed, char * why, size_t why_len) {
    struct layout l = make_layout(dk, dk, heads, kv_heads, seqs, rows, cells, len, 0, seed, seed + 1);
    struct ck_attention * a = &l.a;
    a->isa = isa;
    const int64_t src = seqs - 1;
    for (int64_t s = 0; s < src; s++) {
        for (int64_t g = 0; g < kv_heads; g++) {
            for (int64_t c = 0; c < shared; c++) {
                memcpy(l.k + ((s * kv_heads + g) * cells + c) * dk, l.k + ((src * kv_heads + g) * cells + c) * dk, 2 * (size_t)dk);
                memcpy(l.v + ((s * kv_heads + g) * cells + c) * dk, l.v + ((src * kv_heads + g) * cells + c) * dk, 2 * (size_t)dk);
            }
        }
    }
    const size_t n = (size_t)(dk * heads * rows * seqs);
    run_all(a);
    float * alone = malloc(sizeof(float) * n);
    memcpy(alone, l.out, sizeof(float) * n);
    memset(l.out, 0, sizeof(float) * n);
    float * scratch = malloc(sizeof(float) * ck_attention_scratch_floats(a));
    const int64_t per_item = CK_ATTENTION_GROUP_QUERIES / (heads / kv_heads * rows);
    for (int64_t g = 0; g < kv_heads; g++) {
        for (int64_t s0 = 0; s0 < src; s0 += per_item) {
            struct ck_attention_group group = {(ptrdiff_t)(src * a->k_nb[3]), (ptrdiff_t)(src * a->v_nb[3]), shared, g, 0, {0}};
            for (int64_t s = s0; s < src && s < s0 + per_item; s++) {
                group.seqs[group.n++] = s;
            }
            ck_attention_group_item(a, &group, scratch);
        }
    }
    int failures = 0;
    const size_t per_seq = n / (size_t)seqs;
    if (memcmp(l.out, alone, sizeof(float) * per_seq * (size_t)src) != 0) {
        failures = 1;
        snprintf(why, why_len, "%lld sequences sharing %lld of %lld cells: a group's result differs from the items alone",
                 (long long)src, (long long)shared, (long long)len);
    }
    free(scratch);
    free(alone);
    free_layout(&l);
    return failures;
}

int ck_attention_self_check(enum ck_isa isa, enum ck_isa against, char * why, size_t why_len) {
    // dk/dv, heads, kv heads, seqs, rows, cells, own cells, offset
    static const int64_t cases[][8] = {
        {64, 3 * 3, 3, 4, 1, 256, 100, 0},    // decode, grouped heads, several sequences
        {64, 9, 3, 2, 13, 64, 40, 5},         // prefill, causal, rows across blocks
        {128, 4, 4, 1, 3, 33, 33, 0},         // plain heads, partial last block
        {256, 4, 1, 1, 9, 300, 120, 142},     // Gemma's 256-wide heads, one KV head
        {64, 2, 1, 1, 1, 16, 0, 0},           // everything masked: zeros
    };
    int failures = 0;
    if (why_len) {
        why[0] = 0;
    }
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const int64_t * c = cases[t];
        const int64_t dk = c[0], heads = c[1], kv_heads = c[2], seqs = c[3], rows = c[4], cells = c[5], len = c[6],
                      offset = c[7];
        struct layout l = make_layout(dk, dk, heads, kv_heads, seqs, rows, cells, len, offset, 7 + t, 99);
        l.a.isa = isa;
        const size_t n = (size_t)(dk * heads * rows * seqs);
        run_all(&l.a);
        float * got = malloc(sizeof(float) * n);
        memcpy(got, l.out, sizeof(float) * n);
        if (against != CK_ISA_NONE && against != isa) {
            l.a.isa = against;
            run_all(&l.a);
            if (memcmp(l.out, got, sizeof(float) * n) != 0 && failures++ == 0) {
                snprintf(why, why_len, "case %zu: the %s and %s kernels differ", t, ck_isa_name(isa),
                         ck_isa_name(against));
            }
        }
        ck_attention_reference(&l.a);
        for (size_t i = 0; i < n; i++) {
            const float e = l.out[i];
            if (!(fabsf(got[i] - e) <= 2e-5f + 2e-5f * fabsf(e)) && failures++ == 0) {
                snprintf(why, why_len, "case %zu: output %zu is %.8g, the reference %.8g", t, i, got[i], e);
            }
        }
        // The same sequence elsewhere in the cache, beside other cells.
        if (len > 0) {
            struct layout moved = make_layout(dk, dk, heads, kv_heads, seqs, rows, cells + 37, len, offset + 37, 7 + t, 12345);
            moved.a.isa = isa;
            run_all(&moved.a);
            if (memcmp(moved.out, got, sizeof(float) * n) != 0 && failures++ == 0) {
                snprintf(why, why_len, "case %zu: the same sequence 37 cells further gives another result", t);
            }
            free_layout(&moved);
        }
        free(got);
        free_layout(&l);
    }
    // dk, heads, kv heads, seqs (the last the source), rows, cells, own cells, shared
    static const int64_t groups[][8] = {
        {64, 9, 3, 7, 1, 256, 200, 160},    // decode, grouped heads
        {64, 9, 3, 40, 1, 512, 300, 288},   // more members than one item holds
        {128, 4, 4, 5, 3, 96, 70, 32},      // a short chunk each, plain heads
        {64, 6, 2, 4, 1, 64, 17, 16},       // one shared block
    };
    for (size_t t = 0; t < sizeof groups / sizeof groups[0]; t++) {
        const int64_t * c = groups[t];
        if (failures == 0) {
            failures += check_groups(isa, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], 31 + t, why, why_len);
        } else {
            failures += check_groups(isa, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], 31 + t, NULL, 0);
        }
    }
    return failures;
}
