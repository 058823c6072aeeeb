// Weights of formats without kernels of their own, as the blocks of the
// panel formats (see kernels.h), so that the panel kernels multiply them:
// Q4_0 becomes Q4_1 blocks, Q4_K cortex's own Q4_K blocks (exactly: the
// same quants, d, dmin, and each 32 weights' scale and min), Q5_K Q5_1
// blocks (the same quants; each 32 weights' d * sc and -dmin * m rounded to
// fp16, where ggml multiplies in fp32), Q5_0 exactly either Q5_1 blocks (a
// min of -16 d, exact in fp16) or Q8_0 ones (its quants minus 16), as the
// kernels prefer (see ck_panel_format), and Q6_K cortex's Q6 blocks
// (exactly: the same quants, the super-block's d and the two 8-bit scales
// of each 32 weights).
// And back: a weight is read as ggml's quantizer writes the values it holds.

#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "ggml.h"
#include "panels.h"

// ggml's type ids of the formats taken here.
enum {
    TYPE_Q4_0 = GGML_TYPE_Q4_0,
    TYPE_Q5_0 = GGML_TYPE_Q5_0,
    TYPE_Q4_K = GGML_TYPE_Q4_K,
    TYPE_Q5_K = GGML_TYPE_Q5_K,
    TYPE_Q6_K = GGML_TYPE_Q6_K,
};

// Bytes of ggml's blocks.
#define Q4_0_BLOCK 18   // fp16 d, 16 nibble bytes
#define Q5_0_BLOCK 22   // fp16 d, 4 bytes of high bits, 16 nibble bytes
#define GGML_Q4_K_BLOCK 144  // fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 nibble bytes
#define Q5_K_BLOCK 176  // as Q4_K, with 32 bytes of high bits before the nibbles
#define Q6_K_BLOCK 210  // 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, fp16 d
#define K_WEIGHTS 256   // weights per k-quant super-block

bool ck_convertible(int type) {
    switch (type) {
        case TYPE_Q4_0:
        case TYPE_Q5_0:
        case TYPE_Q4_K:
        case TYPE_Q5_K:
        case TYPE_Q6_K: return true;
        default: return false;
    }
}

enum ck_format ck_panel_format(enum ck_isa isa, int type) {
    switch (type) {
        case CK_Q4_1:
        case TYPE_Q4_0: return CK_Q4_1;
        case CK_Q4_K:
        case TYPE_Q4_K: return CK_Q4_K;
        case TYPE_Q5_0: return isa == CK_ISA_AVX2 ? CK_Q5_1 : CK_Q8_0;
        case CK_Q5_1:
        case TYPE_Q5_K: return CK_Q5_1;
        case CK_Q6_PLANES:
        case TYPE_Q6_K: return CK_Q6_PLANES;
        default: return CK_Q8_0;
    }
}

int64_t ck_type_block(int type) {
    switch (type) {
        case CK_Q4_K:  // their tiles take a super-block's 8 blocks at a time
        case CK_Q6_PLANES:
        case TYPE_Q4_K:
        case TYPE_Q5_K:
        case TYPE_Q6_K: return K_WEIGHTS;
        default: return CK_BLOCK;
    }
}

// Q4_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
static void scale_min_k4(int j, const uint8_t * q, uint8_t * sc, uint8_t * mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void q4_0_row(const uint8_t * src, uint8_t * dst, int64_t cols) {
    for (int64_t b = 0; b < cols / CK_BLOCK; b++) {
        const uint8_t * in = src + (size_t)b * Q4_0_BLOCK;
        uint8_t * out = dst + (size_t)b * Q4_1_BLOCK;
        uint16_t dh;
        memcpy(&dh, in, 2);
        // d (q - 8) = d q + (-8 d): the same nibbles, a min of -8 d (exact in fp16).
        const uint16_t mh = ck_fp32_to_fp16(-8.0f * ck_fp16_to_fp32(dh));
        memcpy(out, &dh, 2);
        memcpy(out + 2, &mh, 2);
        memcpy(out + 4, in + 2, 16);
    }
}

// d (q - 16) = d q + (-16 d): the same quants, a min of -16 d (exact in fp16).
static void q5_0_row_as_q5_1(const uint8_t * src, uint8_t * dst, int64_t cols) {
    for (int64_t b = 0; b < cols / CK_BLOCK; b++) {
        const uint8_t * in = src + (size_t)b * Q5_0_BLOCK;
        uint8_t * out = dst + (size_t)b * Q5_1_BLOCK;
        uint16_t dh;
        memcpy(&dh, in, 2);
        const uint16_t mh = ck_fp32_to_fp16(-16.0f * ck_fp16_to_fp32(dh));
        memcpy(out, &dh, 2);
        memcpy(out + 2, &mh, 2);
        memcpy(out + 4, in + 2, 20);  // the high bits and the nibbles, as Q5_1 holds them
    }
}

// d (q - 16): the 5-bit quants minus 16 as bytes, the same d.
static void q5_0_row_as_q8_0(const uint8_t * src, uint8_t * dst, int64_t cols) {
    for (int64_t b = 0; b < cols / CK_BLOCK; b++) {
        const uint8_t * in = src + (size_t)b * Q5_0_BLOCK;
        uint8_t * out = dst + (size_t)b * Q8_0_BLOCK;
        uint8_t w[CK_BLOCK];
        q5_quants(in + 2, in + 6, w);
        memcpy(out, in, 2);  // d
        for (int j = 0; j < CK_BLOCK; j++) {
            out[2 + j] = (uint8_t)(int8_t)(w[j] - 16);
        }
    }
}

// A Q5_1 block of 32 5-bit weights w.
static void q5_1_block(uint8_t * out, float d, float m, const uint8_t * w) {
    const uint16_t dh = ck_fp32_to_fp16(d), mh = ck_fp32_to_fp16(m);
    memcpy(out, &dh, 2);
    memcpy(out + 2, &mh, 2);
    q5_encode(w, out + 4, out + 8);
}

// Q4_K rows as cortex's Q4_K blocks (the same quants, d, dmin, scales and
// mins), Q5_K rows as Q5_1 blocks: a super-block's 8
// sub-blocks of 32 weights, 2j and 2j + 1 in the low and high nibbles of 32
// bytes; Q5_K's fifth bits in qh (bit `sub` of byte l for sub-block sub's
// weight l).
static void k_quant_row(bool five_bits, const uint8_t * src, uint8_t * dst, int64_t cols) {
    const size_t in_block = five_bits ? Q5_K_BLOCK : GGML_Q4_K_BLOCK;
    const size_t out_block = block_bytes(five_bits ? CK_Q5_1 : CK_Q4_K);
    for (int64_t s = 0; s < cols / K_WEIGHTS; s++) {
        const uint8_t * in = src + (size_t)s * in_block;
        uint8_t * out = dst + (size_t)s * 8 * out_block;
        uint16_t dh, mh;
        memcpy(&dh, in, 2);
        memcpy(&mh, in + 2, 2);
        const float d = ck_fp16_to_fp32(dh), dmin = ck_fp16_to_fp32(mh);
        const uint8_t * scales = in + 4;
        const uint8_t * qh = in + 16;
        const uint8_t * qs = in + (five_bits ? 48 : 16);
        for (int sub = 0; sub < 8; sub++) {
            uint8_t sc, mn, w[32];
            scale_min_k4(sub, scales, &sc, &mn);
            for (int l = 0; l < 32; l++) {
                const uint8_t byte = qs[32 * (sub / 2) + l];
                w[l] = (uint8_t)(sub % 2 ? byte >> 4 : byte & 0x0F);
                if (five_bits) {
                    w[l] = (uint8_t)(w[l] | (((qh[l] >> sub) & 1) << 4));
                }
            }
            uint8_t * o = out + (size_t)sub * out_block;
            if (five_bits) {
                q5_1_block(o, d * (float)sc, -dmin * (float)mn, w);
            } else {
                memcpy(o, in, 4);  // d, dmin
                o[4] = sc;
                o[5] = mn;
                for (int i = 0; i < 16; i++) {
                    o[6 + i] = (uint8_t)((w[i] & 0x0F) | (w[i + 16] << 4));
                }
            }
        }
    }
}

// A Q6_K super-block's 256 quants: weight i is d * sc[i / 16] * (q - 32),
// its 6-bit q the low nibble of ql (weights 0-31 and 64-95 of each
// 128 in the low nibbles of 32 bytes, 32-63 and 96-127 in the high ones)
// and two bits of qh (ggml's dequantize_row_q6_K).
static void q6_k_quants(const uint8_t * in, uint8_t * q) {
    const uint8_t * ql = in;
    const uint8_t * qh = in + 128;
    for (int half = 0; half < 2; half++) {
        const uint8_t * l = ql + 64 * half;
        const uint8_t * h = qh + 32 * half;
        uint8_t * o = q + 128 * half;
        for (int j = 0; j < 32; j++) {
            o[j] = (uint8_t)((l[j] & 0x0F) | ((h[j] & 3) << 4));
            o[j + 32] = (uint8_t)((l[j + 32] & 0x0F) | (((h[j] >> 2) & 3) << 4));
            o[j + 64] = (uint8_t)((l[j] >> 4) | (((h[j] >> 4) & 3) << 4));
            o[j + 96] = (uint8_t)((l[j + 32] >> 4) | (((h[j] >> 6) & 3) << 4));
        }
    }
}

// A Q6_K super-block's 16 scales.
static const int8_t * q6_k_scales(const uint8_t * in) { return (const int8_t *)(in + 192); }

// Q6_K rows as Q6 blocks (the same quants, d and scales; for Q6_PLANES
// panels).
static void q6_k_row(const uint8_t * src, uint8_t * dst, int64_t cols) {
    for (int64_t s = 0; s < cols / K_WEIGHTS; s++) {
        const uint8_t * in = src + (size_t)s * Q6_K_BLOCK;
        const int8_t * scales = q6_k_scales(in);
        uint8_t q[K_WEIGHTS];
        q6_k_quants(in, q);
        for (int b = 0; b < K_WEIGHTS / CK_BLOCK; b++) {
            uint8_t * out = dst + ((size_t)s * (K_WEIGHTS / CK_BLOCK) + (size_t)b) * Q6_BLOCK;
            memcpy(out, in + 208, 2);  // d
            memcpy(out + 2, scales + 2 * b, 2);
            memcpy(out + 4, q + CK_BLOCK * b, CK_BLOCK);
        }
    }
}

// Q6 blocks' values, as the kernels take them (and ggml computes them).
static void q6_values(const uint8_t * src, float * dst, int64_t cols) {
    for (int64_t b = 0; b < cols / CK_BLOCK; b++) {
        q6_block_values(src + (size_t)b * Q6_BLOCK, dst + b * CK_BLOCK);
    }
}

// cortex's Q4_K blocks' values, as ggml computes them: (d sc) q - dmin mn.
static void q4_k_values(const uint8_t * src, float * dst, int64_t cols) {
    for (int64_t b = 0; b < cols / CK_BLOCK; b++) {
        q4_k_block_values(src + (size_t)b * Q4_K_BLOCK, dst + b * CK_BLOCK);
    }
}

void ck_convert(enum ck_isa isa, int type, const void * src, void * dst, int64_t rows, int64_t cols) {
    const enum ck_format format = ck_panel_format(isa, type);
    const size_t src_row = ggml_row_size((enum ggml_type)type, cols);
    const size_t dst_row = (size_t)(cols / CK_BLOCK) * block_bytes(format);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t * in = (const uint8_t *)src + (size_t)r * src_row;
        uint8_t * out = (uint8_t *)dst + (size_t)r * dst_row;
        switch (type) {
            case TYPE_Q4_0: q4_0_row(in, out, cols); break;
            case TYPE_Q5_0:
                if (format == CK_Q5_1) {
                    q5_0_row_as_q5_1(in, out, cols);
                } else {
                    q5_0_row_as_q8_0(in, out, cols);
                }
                break;
            case TYPE_Q4_K: k_quant_row(false, in, out, cols); break;
            case TYPE_Q5_K: k_quant_row(true, in, out, cols); break;
            default: q6_k_row(in, out, cols); break;  // Q6_K
        }
    }
}

void ck_convert_back(enum ck_isa isa, int type, const void * src, void * dst, int64_t rows, int64_t cols) {
    const enum ck_format format = ck_panel_format(isa, type);
    const size_t src_row = (size_t)(cols / CK_BLOCK) * block_bytes(format);
    float * values = malloc(sizeof(float) * (size_t)rows * (size_t)cols);
    if (values == NULL) {
        abort();
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t * in = (const uint8_t *)src + (size_t)r * src_row;
        float * out = values + (size_t)r * (size_t)cols;
        if (format == CK_Q6_PLANES) {
            q6_values(in, out, cols);
        } else if (format == CK_Q4_K) {
            q4_k_values(in, out, cols);
        } else {
            ggml_get_type_traits((enum ggml_type)format)->to_float(in, out, cols);
        }
    }
    ggml_quantize_chunk((enum ggml_type)type, values, dst, 0, rows, cols, NULL);
    free(values);
}
