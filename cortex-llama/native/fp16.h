// fp16 <-> fp32 as ggml converts them without F16C (exact, round to nearest
// even), so that scales rounded by the kernels equal those ggml rounds.

#ifndef CORTEX_FP16_H
#define CORTEX_FP16_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t ck_bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ck_float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ggml's portable conversions (exact, round to nearest even), so that
// scales rounded here equal those ggml's F16C path rounds.
static inline float ck_fp16_to_fp32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = ck_float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = ck_float_of((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t result = sign | (two_w < (1u << 27) ? ck_bits_of(denormalized) : ck_bits_of(normalized));
    return ck_float_of(result);
}

static inline uint16_t ck_fp32_to_fp16(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = ck_bits_of(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) {
        bias = 0x71000000u;
    }
    base = ck_float_of((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = ck_bits_of(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float ck_round_through_fp16(float f) { return ck_fp16_to_fp32(ck_fp32_to_fp16(f)); }

#endif
