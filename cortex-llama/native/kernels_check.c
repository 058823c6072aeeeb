// The matrix kernels' self-check (see kernels.h): a scalar reference doing
// the same arithmetic one element at a time, and random matrices of both
// formats at many batch sizes against it; and the formats packed as them
// against llama.cpp's own values of their weights.

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "ggml.h"
#include "panels.h"

// Activation j of a column's block b (its byte less 128 when `offset`).
static int activation_quant(const uint8_t * column, int64_t b, int j, bool offset) {
    const uint8_t byte = column[b * CK_BLOCK + j];
    return offset ? (int)byte - 128 : (int)(int8_t)byte;
}

// A Q6 block's integer sum: each half's 8-bit scale times sum((q - 32) x)
// = sum(q x) - 32 sum(x), the latter from the column's half sums. (The
// AVX2 tiles sum (q - 32)(x + 128) and take 128 sum(q - 32) away: in
// integers, the same.)
static int32_t q6_block_sum(const uint8_t * blk, const uint8_t * column, int64_t nb, int64_t b, bool offset) {
    int32_t isum = 0;
    for (int h = 0; h < 2; h++) {
        int32_t half_sum = -Q6_OFFSET * column_half_sums(column, nb)[2 * b + h];
        for (int j = 16 * h; j < 16 * h + 16; j++) {
            half_sum += blk[4 + j] * activation_quant(column, b, j, offset);
        }
        isum += (int8_t)blk[2 + h] * half_sum;
    }
    return isum;
}

// A Q4_K block's quants times the column's block b.
static int32_t q4_k_block_sum(const uint8_t * blk, const int8_t * q) {
    int32_t sum = 0;
    for (int j = 0; j < CK_BLOCK; j++) {
        sum += q4_k_quant(blk, j) * q[j];
    }
    return sum;
}

// Q4_K and Q6_PLANES against activations with one scale per super-block,
// as the tiles compute them: each super-block's blocks' integer sums times
// their 8-bit scales (Q6_PLANES: of each half, from the half's start at -32
// times its sum of quants), and Q4_K's minimums times the blocks' sums of
// quants, summed in integers (exact); then fmaf((float)sum, d dx, acc) and,
// for Q4_K, fmaf((float)mins, -dmin dx, acc), super-blocks in order. With
// `float_halves` (see ck_encoding), Q6_PLANES' halves' sums instead add up
// as fmaf((float)half_sum, d sc, sum), and the super-block's step is
// fmaf(sum, dx, acc).
static float reference_dot_super_blocks(enum ck_format format, struct ck_encoding encoding, const void * m,
                                        int64_t cols, int64_t row, const uint8_t * column) {
    const bool float_halves = encoding.float_halves;
    const int64_t nb = cols / CK_BLOCK;
    const int8_t * q = (const int8_t *)column;
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / CK_SUPER_BLOCKS; sb++) {
        const uint8_t * first = ggml_block(format, m, cols, row, CK_SUPER_BLOCKS * sb);
        uint16_t dh;
        memcpy(&dh, first, 2);
        const float d = ck_fp16_to_fp32(dh);
        int32_t isum = 0, mins = 0;
        float fsum = 0.0f;
        for (int64_t b = CK_SUPER_BLOCKS * sb; b < CK_SUPER_BLOCKS * (sb + 1); b++) {
            const uint8_t * blk = ggml_block(format, m, cols, row, b);
            if (format == CK_Q6_PLANES && !float_halves) {
                isum += q6_block_sum(blk, column, nb, b, encoding.offset);
                continue;
            }
            if (format == CK_Q6_PLANES) {
                // Each half's integer sum from its start in the activations
                // (-32 times its sum of quants), times its d sc.
                uint16_t bh;
                memcpy(&bh, blk, 2);
                const float dw = ck_fp16_to_fp32(bh);
                for (int h = 0; h < 2; h++) {
                    int32_t half_sum = column_half_offsets(column, nb)[2 * b + h];
                    for (int j = 16 * h; j < 16 * h + 16; j++) {
                        half_sum += blk[4 + j] * q[b * CK_BLOCK + j];
                    }
                    fsum = fmaf((float)half_sum, dw * (float)(int8_t)blk[2 + h], fsum);
                }
                continue;
            }
            isum += blk[4] * q4_k_block_sum(blk, q + b * CK_BLOCK);
            mins += blk[5] * column_block_sums(column, nb)[b];
        }
        const float dx = column_scales(column, nb)[CK_SUPER_BLOCKS * sb];
        acc = float_halves ? fmaf(fsum, dx, acc) : fmaf((float)isum, d * dx, acc);
        if (format == CK_Q4_K) {
            uint16_t mh;
            memcpy(&mh, first + 2, 2);
            acc = fmaf((float)mins, -ck_fp16_to_fp32(mh) * dx, acc);
        }
    }
    return acc;
}

// The same arithmetic as the vector kernels, one element at a time: a
// block's integer sum (exact), then fmaf(sum, dw * dx, acc) (and, for the
// formats with a minimum, fmaf(m, dx * sum_x, acc)), blocks in order. The
// vector kernels must agree with it bit for bit.
static float reference_dot(enum ck_format format, const void * m, int64_t cols, int64_t row,
                           const uint8_t * column, struct ck_encoding encoding) {
    if (encoding.per_super_block) {
        return reference_dot_super_blocks(format, encoding, m, cols, row, column);
    }
    const bool offset = encoding.offset;
    const int64_t nb = cols / CK_BLOCK;
    const int8_t * q = (const int8_t *)column;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = ggml_block(format, m, cols, row, b);
        uint16_t dh;
        memcpy(&dh, blk, 2);
        const float dw = ck_fp16_to_fp32(dh);
        const float dx = column_scales(column, nb)[b];
        int32_t isum = 0;
        if (format == CK_Q4_1) {
            for (int j = 0; j < 16; j++) {
                isum += (blk[4 + j] & 0x0F) * q[b * CK_BLOCK + j];
                isum += (blk[4 + j] >> 4) * q[b * CK_BLOCK + j + 16];
            }
        } else if (format == CK_Q4_K) {
            isum = q4_k_block_sum(blk, q + b * CK_BLOCK);
        } else if (format == CK_Q5_1) {
            uint8_t w[CK_BLOCK];
            q5_quants(blk + 4, blk + 8, w);
            for (int j = 0; j < CK_BLOCK; j++) {
                isum += w[j] * q[b * CK_BLOCK + j];
            }
        } else {
            for (int j = 0; j < CK_BLOCK; j++) {
                const int x = offset ? (int)((const uint8_t *)q)[b * CK_BLOCK + j] - 128 : q[b * CK_BLOCK + j];
                isum += (int8_t)blk[2 + j] * x;
            }
        }
        if (format == CK_Q4_K) {
            float d_sc, minus_dmin_mn;
            q4_k_scales(blk, &d_sc, &minus_dmin_mn);
            acc = fmaf((float)isum, d_sc * dx, acc);
            acc = fmaf(minus_dmin_mn, column_sums(column, nb)[b], acc);
            continue;
        }
        acc = fmaf((float)isum, dw * dx, acc);
        if (has_min(format)) {
            uint16_t mh;
            memcpy(&mh, blk + 2, 2);
            acc = fmaf(ck_fp16_to_fp32(mh), column_sums(column, nb)[b], acc);
        }
    }
    return acc;
}

static uint32_t next_random(uint64_t * state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*state >> 33);
}

static float random_unit(uint64_t * state) { return (float)next_random(state) / 2147483648.0f - 1.0f; }

// Random ggml blocks: scales of either sign and size, every nibble/byte.
static void random_matrix(enum ck_format format, uint8_t * m, int64_t rows, int64_t cols, uint64_t * state) {
    const size_t n = (size_t)rows * (size_t)(cols / CK_BLOCK);
    for (size_t i = 0; i < n; i++) {
        uint8_t * blk = m + i * block_bytes(format);
        if (format == CK_Q4_K) {
            // A super-block's 8 blocks (in a row) share its d and dmin.
            if (i % CK_SUPER_BLOCKS == 0) {
                const uint16_t d = ck_fp32_to_fp16(random_unit(state) * 0.02f);
                const uint16_t dmin = ck_fp32_to_fp16(random_unit(state) * 0.05f);
                memcpy(blk, &d, 2);
                memcpy(blk + 2, &dmin, 2);
            } else {
                memcpy(blk, blk - block_bytes(format), 4);
            }
            for (size_t j = 4; j < block_bytes(format); j++) {
                blk[j] = (uint8_t)next_random(state);  // scales and mins: any 8 bits
            }
            continue;
        }
        const uint16_t d = ck_fp32_to_fp16(random_unit(state) * 0.02f);
        memcpy(blk, &d, 2);
        if (format == CK_Q6_PLANES && i % CK_SUPER_BLOCKS != 0) {
            memcpy(blk, blk - block_bytes(format), 2);  // as in Q6_K, a super-block's 8 share d
        }
        if (has_min(format)) {
            const uint16_t mn = ck_fp32_to_fp16(random_unit(state) * 0.1f);
            memcpy(blk + 2, &mn, 2);
            for (size_t j = 4; j < block_bytes(format); j++) {
                blk[j] = (uint8_t)next_random(state);
            }
        } else if (format == CK_Q6_PLANES) {
            blk[2] = (uint8_t)next_random(state);  // the scales: any int8
            blk[3] = (uint8_t)next_random(state);
            for (int j = 0; j < CK_BLOCK; j++) {
                blk[4 + j] = (uint8_t)(next_random(state) % 64);
            }
        } else {
            for (int j = 0; j < CK_BLOCK; j++) {
                blk[2 + j] = (uint8_t)next_random(state);
            }
        }
    }
}

// The formats packed as a panel format (see convert.c), against what
// llama.cpp computes with them: random weights quantized by ggml, packed,
// multiplied by the kernels of `isa`, and compared with the dot products of
// ggml's own dequantization (exact for the lossless conversions, Q5_K's
// scales within fp16's rounding) with the float activations,
// to 1% of the sum of the products' magnitudes (the activations' 8-bit
// quantization alone costs about 0.4%; llama.cpp's own tolerance for a
// format's dot product is 2% of the vector's length).
static int check_converted(enum ck_isa isa, char * why, size_t why_len, uint64_t * state, int mismatches) {
    static const int types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    static const int64_t shapes[][2] = {{16, 256}, {48, 512}, {32, 768}};
    static const int64_t batches[] = {1, 3, 8, 9};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int type = types[t];
        const enum ck_format format = ck_panel_format(isa, type);
        // How far a packed weight may be from ggml's value, relative to the
        // row's largest: exact, but Q5_K's (as Q5_1, its scales rounded to
        // fp16).
        const float weight_tolerance = type == GGML_TYPE_Q5_K ? 2e-3f : 0.0f;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            float * w = malloc(sizeof(float) * (size_t)(rows * cols));
            for (int64_t i = 0; i < rows * cols; i++) {
                w[i] = random_unit(state) * (i % 5 == 0 ? 2.0f : 1.0f);
            }
            uint8_t * raw = malloc(ggml_row_size((enum ggml_type)type, cols) * (size_t)rows);
            ggml_quantize_chunk((enum ggml_type)type, w, raw, 0, rows, cols, NULL);
            uint8_t * packed = malloc(ck_packed_size(isa, type, rows, cols));
            ck_pack(isa, type, raw, packed, rows, cols);
            // ggml's values of the weights, and the kernels' row.
            float * values = malloc(sizeof(float) * (size_t)(rows * cols));
            float * row = malloc(sizeof(float) * (size_t)cols);
            const size_t raw_row = ggml_row_size((enum ggml_type)type, cols);
            for (int64_t r = 0; r < rows; r++) {
                ggml_get_type_traits((enum ggml_type)type)->to_float(raw + (size_t)r * raw_row,
                                                                     values + r * cols, cols);
                ck_dequantize_row(format, packed, rows, cols, r, row);
                float largest = 0.0f;
                for (int64_t k = 0; k < cols; k++) {
                    largest = fmaxf(largest, fabsf(values[r * cols + k]));
                }
                for (int64_t k = 0; k < cols; k++) {
                    const float off = fabsf(row[k] - values[r * cols + k]);
                    if (off > weight_tolerance * largest && mismatches++ == 0) {
                        snprintf(why, why_len, "%s: packed weight (%lld, %lld) is %.9g, ggml's %.9g",
                                 ggml_type_name((enum ggml_type)type), (long long)r, (long long)k, row[k],
                                 values[r * cols + k]);
                    }
                }
            }
            for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                const int64_t n = batches[bi];
                const size_t astride = ck_activation_bytes(cols);
                uint8_t * act = aligned_alloc(64, astride * (size_t)n);
                float * x = malloc(sizeof(float) * (size_t)(cols * n));
                for (int64_t i = 0; i < cols * n; i++) {
                    x[i] = random_unit(state);
                }
                for (int64_t c = 0; c < n; c++) {
                    ck_quantize_column(isa, format, n, x + c * cols, cols, act + (size_t)c * astride);
                }
                float * out = malloc(sizeof(float) * (size_t)(rows * n));
                ck_gemm(isa, format, packed, cols, 0, rows / CK_PANEL_ROWS, act, n, out, rows);
                for (int64_t c = 0; c < n; c++) {
                    for (int64_t r = 0; r < rows; r++) {
                        double expected = 0.0, magnitude = 0.0;
                        for (int64_t k = 0; k < cols; k++) {
                            const double product = (double)values[r * cols + k] * (double)x[c * cols + k];
                            expected += product;
                            magnitude += fabs(product);
                        }
                        const double got = out[c * rows + r];
                        if (fabs(got - expected) > 0.01 * magnitude && mismatches++ == 0) {
                            snprintf(why, why_len,
                                     "%s %s %lldx%lld batch %lld: row %lld column %lld is %.6g, llama.cpp's %.6g",
                                     ck_isa_name(isa), ggml_type_name((enum ggml_type)type), (long long)rows,
                                     (long long)cols, (long long)n, (long long)r, (long long)c, got, expected);
                        }
                    }
                }
                free(out);
                free(x);
                free(act);
            }
            free(row);
            free(values);
            free(packed);
            free(raw);
            free(w);
        }
    }
    return mismatches;
}

// The first index of the largest value, NaN ignored; with none above -inf,
// the first -inf, else 0: the plainest statement of ck_argmax's rule.
static int32_t reference_argmax(const float * x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++) {
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) {
            best = i;
        }
    }
    return best < 0 ? 0 : (int32_t)best;
}

// Rows of every length around the vector widths, with few distinct values
// (ties across lanes), NaN, -inf, and rows of nothing else.
static int check_argmax(enum ck_isa isa, char * why, size_t why_len, uint64_t * state, int mismatches) {
    static const int64_t lengths[] = {1, 7, 8, 9, 31, 32, 33, 100, 1000, 4099};
    float * x = malloc(sizeof(float) * 4099);
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        const int64_t n = lengths[li];
        for (int round = 0; round < 24; round++) {
            for (int64_t i = 0; i < n; i++) {
                const uint32_t r = next_random(state);
                x[i] = (float)(r % 7);
                if (round % 4 == 1 && r % 5 == 0) {
                    x[i] = NAN;
                }
                if (round % 4 == 2) {
                    x[i] = r % 3 == 0 ? NAN : -INFINITY;
                }
                if (round % 4 == 3) {
                    x[i] = round % 8 == 3 ? NAN : -INFINITY;
                }
            }
            const int32_t got = ck_argmax(isa, x, n);
            const int32_t expected = reference_argmax(x, n);
            if (got != expected && mismatches++ == 0) {
                snprintf(why, why_len, "%s argmax of %lld floats (round %d): %d, the reference %d", ck_isa_name(isa),
                         (long long)n, round, got, expected);
            }
        }
    }
    free(x);
    return mismatches;
}

int ck_self_check(enum ck_isa isa, char * why, size_t why_len) {
    static const int64_t shapes[][2] = {{16, 32},   {48, 96},    {192, 576},  {576, 576},
                                        {576, 1536}, {1536, 576}, {32, 256},   {48, 768}};
    // (More than one column tile: Q6_PLANES products unpack each panel once,
    // see gemm.c.)
    static const int64_t batches[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 33, 64, 71};
    const enum ck_format formats[] = {CK_Q4_1, CK_Q5_1, CK_Q8_0, CK_Q6_PLANES, CK_Q4_K};
    const size_t n_formats = sizeof formats / sizeof formats[0];
    uint64_t state = 0x5eed;
    int mismatches = 0;
    if (why_len) {
        why[0] = 0;
    }
    for (size_t f = 0; f < n_formats; f++) {
        const enum ck_format format = formats[f];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            if (cols % ck_type_block(format) != 0) {
                continue;  // Q4_K, Q6_PLANES: whole super-blocks of 256 only
            }
            const size_t raw_bytes = (size_t)rows * (size_t)(cols / CK_BLOCK) * block_bytes(format);
            uint8_t * raw = malloc(raw_bytes);
            uint8_t * back = malloc(raw_bytes);
            uint8_t * packed = malloc(ck_packed_size(isa, format, rows, cols));
            random_matrix(format, raw, rows, cols, &state);
            ck_pack(isa, format, raw, packed, rows, cols);
            ck_unpack(isa, format, packed, back, rows, cols);
            if (memcmp(raw, back, raw_bytes) != 0 && mismatches++ == 0) {
                snprintf(why, why_len, "format %d %lldx%lld: unpack(pack(m)) != m", (int)format,
                         (long long)rows, (long long)cols);
            }
            float * row = malloc(sizeof(float) * (size_t)cols);
            ck_dequantize_row(format, packed, rows, cols, rows - 1, row);
            for (int64_t k = 0; k < cols; k++) {
                const uint8_t * blk = ggml_block(format, raw, cols, rows - 1, k / CK_BLOCK);
                uint16_t dh;
                memcpy(&dh, blk, 2);
                const int j = (int)(k % CK_BLOCK);
                float expected;
                if (format == CK_Q4_1) {
                    uint16_t mh;
                    memcpy(&mh, blk + 2, 2);
                    const int q = j < 16 ? blk[4 + j] & 0x0F : blk[4 + j - 16] >> 4;
                    expected = (float)q * ck_fp16_to_fp32(dh) + ck_fp16_to_fp32(mh);
                } else if (format == CK_Q4_K) {
                    const float d_sc = ck_fp16_to_fp32(dh) * (float)blk[4];
                    uint16_t mh;
                    memcpy(&mh, blk + 2, 2);
                    expected = d_sc * (float)q4_k_quant(blk, j) - ck_fp16_to_fp32(mh) * (float)blk[5];
                } else if (format == CK_Q5_1) {
                    uint16_t mh;
                    memcpy(&mh, blk + 2, 2);
                    uint8_t w[CK_BLOCK];
                    q5_quants(blk + 4, blk + 8, w);
                    expected = (float)w[j] * ck_fp16_to_fp32(dh) + ck_fp16_to_fp32(mh);
                } else if (format == CK_Q6_PLANES) {
                    expected = ck_fp16_to_fp32(dh) * (float)(int8_t)blk[2 + j / 16] * (float)(blk[4 + j] - Q6_OFFSET);
                } else {
                    expected = (float)(int8_t)blk[2 + j] * ck_fp16_to_fp32(dh);
                }
                if (row[k] != expected && mismatches++ == 0) {
                    snprintf(why, why_len, "format %d: dequantized row differs at %lld", (int)format, (long long)k);
                }
            }
            free(row);
            for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                const int64_t n = batches[bi];
                const size_t astride = ck_activation_bytes(cols);
                uint8_t * act = aligned_alloc(64, astride * (size_t)n);
                float * x = malloc(sizeof(float) * (size_t)cols);
                for (int64_t c = 0; c < n; c++) {
                    for (int64_t k = 0; k < cols; k++) {
                        x[k] = random_unit(&state) * (k % 7 == 0 ? 8.0f : 1.0f);
                    }
                    if (c == 1) {
                        memset(x, 0, sizeof(float) * (cols >= CK_SUPER_BLOCKS * CK_BLOCK ? CK_SUPER_BLOCKS * CK_BLOCK : CK_BLOCK));  // an all-zero block (super-block)
                    }
                    if (c == 2) {
                        // A block whose scale is 1: 2.5, 3.5 and -2.5 are ties,
                        // rounded to even.
                        x[0] = 127.0f;
                        x[1] = 2.5f;
                        x[2] = 3.5f;
                        x[3] = -2.5f;
                    }
                    ck_quantize_column(isa, format, n, x, cols, act + (size_t)c * astride);
                    uint8_t * scalar = malloc(astride);
                    ck_quantize_column_scalar(format, activation_encoding(isa, format, n), x, cols, scalar);
                    if (memcmp(scalar, act + (size_t)c * astride, (size_t)(cols / CK_BLOCK) * (CK_BLOCK + (format == CK_Q6_PLANES ? 16 : 8))) != 0 &&
                        mismatches++ == 0) {
                        snprintf(why, why_len, "%s format %d: vector quantization differs from the scalar one",
                                 ck_isa_name(isa), (int)format);
                    }
                    free(scalar);
                }
                float * out = malloc(sizeof(float) * (size_t)(rows * n));
                // Two calls over halves of the panels, as two threads would.
                const int64_t panels = rows / CK_PANEL_ROWS;
                ck_gemm(isa, format, packed, cols, 0, panels / 2, act, n, out, rows);
                ck_gemm(isa, format, packed, cols, panels / 2, panels, act, n, out, rows);
                const struct ck_encoding encoding = activation_encoding(isa, format, n);
                for (int64_t c = 0; c < n; c++) {
                    for (int64_t r = 0; r < rows; r++) {
                        const float expected = reference_dot(format, raw, cols, r, act + (size_t)c * astride, encoding);
                        const float got = out[c * rows + r];
                        if (memcmp(&expected, &got, sizeof got) != 0 && mismatches++ == 0) {
                            snprintf(why, why_len,
                                     "%s format %d %lldx%lld batch %lld: row %lld column %lld is %.9g, "
                                     "the reference %.9g",
                                     ck_isa_name(isa), (int)format, (long long)rows, (long long)cols, (long long)n,
                                     (long long)r, (long long)c, got, expected);
                        }
                    }
                }
                free(out);
                free(x);
                free(act);
            }
            free(packed);
            free(back);
            free(raw);
        }
    }
    mismatches = check_converted(isa, why, why_len, &state, mismatches);
    return check_argmax(isa, why, why_len, &state, mismatches);
}
