// What the matrix kernels' files share: the panel layout of packed
// weights and of quantized activations, and the instruction-set attributes.

#ifndef CORTEX_PANELS_H
#define CORTEX_PANELS_H

#include <string.h>

#include "fp16.h"
#include "kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#    define CK_X86 1
#    include <immintrin.h>
#    define CK_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#    define CK_AVX2 __attribute__((target("avx2,fma,f16c")))
#    define CK_AVX_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#    define CK_INLINE static inline __attribute__((always_inline))
#endif

// Bytes of one block of one panel: 16 rows of one quantization block.
#define Q4_1_PANEL_BLOCK 320  // 4 x 64 nibble bytes, 16 fp16 d, 16 fp16 m
#define Q5_1_PANEL_BLOCK 576  // 8 x 64 quant bytes (0-31), 16 fp16 d, 16 fp16 m
#define Q8_0_PANEL_BLOCK 576  // 8 x 64 bytes, 16 fp16 d, 16 int16 row sums
// Q4_K and Q6_PLANES panels go by super-blocks of 8 blocks (k-quants' 256
// weights): a header with the super-block's values, then each block's
// quants, all in whole cache lines (so no load splits one).
// Q4_K: a header of 16 fp16 d, 16 fp16 dmin and each block's 16 scales and
// 16 mins, then each block's 4 x 64 nibble bytes (as Q4_1's).
#define Q4_K_PANEL_HEADER 320
#define Q4_K_PANEL_BLOCK 256
#define Q4_K_SUPER_BLOCKS CK_SUPER_BLOCKS
// Where block j's scales are in its super-block's header (its mins 16 after).
#define Q4_K_SCALES(j) (64 + 32 * (j))
#define Q4_K_PANEL_SUPER (Q4_K_PANEL_HEADER + Q4_K_SUPER_BLOCKS * Q4_K_PANEL_BLOCK)
// Q6_PLANES: a header of 16 fp16 d (Q6_K has one a super-block) and each
// block's 16 pairs of int8 scales (288 bytes, 32 spare), then each block's
// 4 x 64 nibble bytes and 2 x 64 bytes of bit pairs: 6.63 bits a weight
// (Q6_K's own 6.56 and the lines' padding). With d and the scales in each
// block (448 bytes, 7 bits) one sequence read 5% more of a Q6_K matrix.
#define Q6_PLANES_PANEL_HEADER 320
#define Q6_PLANES_PANEL_BLOCK 384
// Where block j's scale pairs are in its super-block's header.
#define Q6_PLANES_SCALES(j) (32 + 32 * (j))
#define Q6_PLANES_SPARE Q6_PLANES_SCALES(CK_SUPER_BLOCKS)
// Where a Q6_PLANES panel block's bit pairs start.
#define Q6_PLANES_PAIRS 256
#define Q6_PLANES_PANEL_SUPER (Q6_PLANES_PANEL_HEADER + CK_SUPER_BLOCKS * Q6_PLANES_PANEL_BLOCK)
#define Q4_1_BLOCK 20         // ggml's block_q4_1: fp16 d, fp16 m, 16 bytes
#define Q5_1_BLOCK 24         // ggml's block_q5_1: fp16 d, fp16 m, 4 bytes of high bits, 16 bytes
#define Q8_0_BLOCK 34         // ggml's block_q8_0: fp16 d, 32 bytes
// cortex's Q4_K block, a 32-weight slice of a Q4_K super-block: its fp16 d
// and dmin, the slice's 8-bit scale and min, 16 nibble bytes as Q4_1's.
#define Q4_K_BLOCK 22
// cortex's Q6 block, what a 32-weight slice of a Q6_K super-block holds:
// the super-block's fp16 d, the int8 scales of weights 0-15 and of 16-31,
// 32 quant bytes q (0-63); weight j is d sc[j / 16] (q - 32).
#define Q6_BLOCK 36

static inline size_t panel_block_bytes(enum ck_format format) {
    switch (format) {
        case CK_Q4_1: return Q4_1_PANEL_BLOCK;
        case CK_Q5_1: return Q5_1_PANEL_BLOCK;
        case CK_Q6_PLANES: return Q6_PLANES_PANEL_SUPER / CK_SUPER_BLOCKS;  // on average
        case CK_Q4_K: return Q4_K_PANEL_SUPER / Q4_K_SUPER_BLOCKS;          // on average
        default: return Q8_0_PANEL_BLOCK;
    }
}

static inline size_t block_bytes(enum ck_format format) {
    switch (format) {
        case CK_Q4_1: return Q4_1_BLOCK;
        case CK_Q5_1: return Q5_1_BLOCK;
        case CK_Q6_PLANES: return Q6_BLOCK;
        case CK_Q4_K: return Q4_K_BLOCK;
        default: return Q8_0_BLOCK;
    }
}

// A Q6 quant's offset: weight j of a block is d sc (q_j - 32).
#define Q6_OFFSET 32

// A Q6 block's 32 weights as ggml's dequantize_row_q6_K computes them:
// (d * sc) * (q - 32), in that order.
static inline void q6_block_values(const uint8_t * blk, float * out) {
    uint16_t dh;
    memcpy(&dh, blk, 2);
    const float d = ck_fp16_to_fp32(dh);
    for (int j = 0; j < CK_BLOCK; j++) {
        out[j] = d * (float)(int8_t)blk[2 + j / 16] * (float)(blk[4 + j] - Q6_OFFSET);
    }
}

// Whether a format's weights have a minimum (d q + m), so its activations
// carry each block's scale times the sum of its quants.
static inline bool has_min(enum ck_format format) {
    return format == CK_Q4_1 || format == CK_Q5_1 || format == CK_Q4_K;
}

// A Q4_K block's weight j's quant (0-15) and the block's d sc and -(dmin mn),
// as ggml's dequantize_row_q4_K computes them.
static inline int q4_k_quant(const uint8_t * blk, int j) {
    return j < 16 ? blk[6 + j] & 0x0F : blk[6 + j - 16] >> 4;
}

static inline void q4_k_scales(const uint8_t * blk, float * d_sc, float * minus_dmin_mn) {
    uint16_t dh, mh;
    memcpy(&dh, blk, 2);
    memcpy(&mh, blk + 2, 2);
    *d_sc = ck_fp16_to_fp32(dh) * (float)blk[4];
    *minus_dmin_mn = -ck_fp16_to_fp32(mh) * (float)blk[5];
}

// A Q4_K block's 32 weights: (d sc) q - dmin mn, as ggml computes them.
static inline void q4_k_block_values(const uint8_t * blk, float * out) {
    float d_sc, minus_dmin_mn;
    q4_k_scales(blk, &d_sc, &minus_dmin_mn);
    for (int j = 0; j < CK_BLOCK; j++) {
        out[j] = d_sc * (float)q4_k_quant(blk, j) + minus_dmin_mn;
    }
}

static inline const uint8_t * ggml_block(enum ck_format format, const void * m, int64_t cols, int64_t r, int64_t b) {
    return (const uint8_t *)m + ((size_t)r * (size_t)(cols / CK_BLOCK) + (size_t)b) * block_bytes(format);
}

// Whether a format's panels go by super-blocks with a header (see above).
static inline bool super_block_panels(enum ck_format format) {
    return format == CK_Q4_K || format == CK_Q6_PLANES;
}

// How far panel block b's quants are past the start of its super-block
// (Q4_K, Q6_PLANES).
static inline size_t past_header(enum ck_format format, int64_t b) {
    return format == CK_Q4_K ? Q4_K_PANEL_HEADER + (size_t)(b % CK_SUPER_BLOCKS) * Q4_K_PANEL_BLOCK
                             : Q6_PLANES_PANEL_HEADER + (size_t)(b % CK_SUPER_BLOCKS) * Q6_PLANES_PANEL_BLOCK;
}

static inline size_t panel_block_offset(enum ck_format format, int64_t cols, int64_t panel, int64_t b) {
    if (super_block_panels(format)) {
        return ((size_t)panel * (size_t)(cols / CK_BLOCK) + (size_t)(b / CK_SUPER_BLOCKS) * CK_SUPER_BLOCKS) *
                   panel_block_bytes(format) +
               past_header(format, b);
    }
    return ((size_t)panel * (size_t)(cols / CK_BLOCK) + (size_t)b) * panel_block_bytes(format);
}

// A 5-bit block's 32 quants (0-31), from ggml's 4 bytes of high bits and
// 16 nibble bytes (weight j and j + 16 share byte j), and back.
static inline void q5_quants(const uint8_t * qh_bytes, const uint8_t * qs, uint8_t * w) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < 16; j++) {
        w[j] = (uint8_t)((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10));
        w[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
    }
}

static inline void q5_encode(const uint8_t * w, uint8_t * qh_bytes, uint8_t * qs) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((w[j] & 0x0F) | ((w[j + 16] & 0x0F) << 4));
        qh |= (uint32_t)(w[j] >> 4) << j | (uint32_t)(w[j + 16] >> 4) << (j + 16);
    }
    memcpy(qh_bytes, &qh, 4);
}

static inline const float * column_scales(const uint8_t * column, int64_t nb) {
    return (const float *)(column + (size_t)nb * CK_BLOCK);
}

static inline const float * column_sums(const uint8_t * column, int64_t nb) {
    return (const float *)(column + (size_t)nb * CK_BLOCK) + nb;
}

// Activations with one scale per super-block (see activation_encoding): the
// sums of each block's quants as int16, in the scaled sums' place (the
// kernel multiplies a pair of them by a row's two minimums in one vpmaddwd).
static inline const int16_t * column_block_sums(const uint8_t * column, int64_t nb) {
    return (const int16_t *)column_sums(column, nb);
}

// Q6_PLANES activations: the sums of each block's two halves' quants, in the
// scaled sums' place.
static inline const int16_t * column_half_sums(const uint8_t * column, int64_t nb) {
    return (const int16_t *)column_sums(column, nb);
}

// And after the sums, -32 times each block's two half sums as int32, where
// the AVX-512 kernel starts each half's integer sum (a broadcast from
// memory, no arithmetic a column).
static inline const int32_t * column_half_offsets(const uint8_t * column, int64_t nb) {
    return (const int32_t *)(column_sums(column, nb) + nb);
}

// Whether `isa` runs in 256-bit registers (AVX2, with or without AVX-VNNI):
// the same quantizer, attention and argmax, only the matrix tiles differ.
static inline bool ymm_isa(enum ck_isa isa) {
    return isa == CK_ISA_AVX2 || isa == CK_ISA_AVX_VNNI;
}

// Columns from which the AVX2 Q6_PLANES product takes its activations
// offset by 128 (see q6_planes_block_ymm: its group's later column tiles
// run faster so, its first slower).
#define CK_Q6_OFFSET_COLUMNS 32

// Whether `isa`'s kernel for `format` takes its quants offset by 128
// (vpdpbusd and vpmaddubsw multiply an unsigned byte by a signed one): Q8_0
// with VNNI, and Q6_PLANES with AVX2 in a product of `n_cols` columns from
// CK_Q6_OFFSET_COLUMNS.
static inline bool offset_quants(enum ck_isa isa, enum ck_format format, int64_t n_cols) {
    return (format == CK_Q8_0 && (isa == CK_ISA_AVX512 || isa == CK_ISA_AVX_VNNI)) ||
           (format == CK_Q6_PLANES && isa == CK_ISA_AVX2 && n_cols >= CK_Q6_OFFSET_COLUMNS);
}

// How a kernel takes its activations, and sums: the quants offset by 128
// (vpdpbusd multiplies an unsigned byte by a signed one); one scale per
// 256-weight super-block instead of one per block, as ggml's Q8_K (the
// Q4_K and Q6_PLANES tiles take a single float step with the column's
// scale for a super-block's 8 blocks). Q4_K's blocks' integer sums, and
// Q6_PLANES' on 256 bits, add up over the super-block in integers, times
// the rows' 8-bit scales (vpmaddwd of 16-bit sums on 256 bits, vpdpwssd of
// half blocks' sums on 512); on 512 bits Q6_PLANES' halves' sums become
// floats times their rows' d sc and add up in floats (`float_halves`: a
// half's sum, -32 offset and all, needs 17 bits, too wide for vpdpwssd).
// This is also the order of the scalar reference (kernels_check.c).
struct ck_encoding {
    bool offset;
    bool per_super_block;
    bool float_halves;
};

static inline struct ck_encoding activation_encoding(enum ck_isa isa, enum ck_format format, int64_t n_cols) {
    const bool k_quant = format == CK_Q4_K || format == CK_Q6_PLANES;
    const struct ck_encoding encoding = {offset_quants(isa, format, n_cols),
                                         (ymm_isa(isa) || isa == CK_ISA_AVX512) && k_quant,
                                         isa == CK_ISA_AVX512 && format == CK_Q6_PLANES};
    return encoding;
}

// Quantizes one column in plain C (the vector versions must match it).
void ck_quantize_column_scalar(enum ck_format format, struct ck_encoding encoding, const float * x, int64_t cols,
                               uint8_t * out);

#endif
