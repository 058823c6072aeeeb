// The panel layout: ggml's row-major blocks packed into panels of 16 rows
// and back, a row read out as floats, and which instruction set runs the
// kernels (see kernels.h).

#define _GNU_SOURCE  // sched_getaffinity
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "ggml.h"
#include "panels.h"

bool ck_isa_supported(enum ck_isa isa) {
#if CK_X86 && defined(__GNUC__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    switch (isa) {
        case CK_ISA_AVX512:
            return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
        case CK_ISA_AVX_VNNI: return avx2 && __builtin_cpu_supports("avxvnni");
        case CK_ISA_AVX2: return avx2;
        default: return false;
    }
#else
    (void)isa;
    return false;
#endif
}

enum ck_isa ck_best_isa_up_to(enum ck_isa ceiling) {
    for (int isa = ceiling; isa > CK_ISA_NONE; isa--) {
        if (ck_isa_supported((enum ck_isa)isa)) {
            return (enum ck_isa)isa;
        }
    }
    return CK_ISA_NONE;
}

enum ck_isa ck_detect_isa(void) {
    return ck_best_isa_up_to(CK_ISA_AVX512);
}

const char * ck_isa_name(enum ck_isa isa) {
    switch (isa) {
        case CK_ISA_AVX512: return "AVX-512 VNNI";
        case CK_ISA_AVX_VNNI: return "AVX-VNNI";
        case CK_ISA_AVX2: return "AVX2";
        default: return "none";
    }
}

bool ck_packable(int type, int64_t rows, int64_t cols) {
    return (type == CK_Q4_1 || type == CK_Q5_1 || type == CK_Q8_0 || type == CK_Q6_PLANES ||
            type == CK_Q4_K || ck_convertible(type)) &&
           rows > 0 && cols > 0 &&
           rows % CK_PANEL_ROWS == 0 && cols % ck_type_block(type) == 0;
}

size_t ck_packed_size(enum ck_isa isa, int type, int64_t rows, int64_t cols) {
    if (!ck_packable(type, rows, cols)) {
        return 0;
    }
    return (size_t)(rows / CK_PANEL_ROWS) * (size_t)(cols / CK_BLOCK) * panel_block_bytes(ck_panel_format(isa, type));
}

// Where row r's block b lives in ggml's layout, and in the panels.

// Q4_1 panel block: chunk h (64 bytes) holds, in lane r, row r's nibble
// bytes 4h..4h+3; their low nibbles are weights 4h..4h+3 and their high
// nibbles weights 16+4h..16+4h+3. Then 16 fp16 d and 16 fp16 m.
// Q5_1 panel block: chunk g holds, in lane r, row r's quants 4g..4g+3 (a
// byte each, 0-31); then 16 fp16 d and 16 fp16 m.
// Q6_PLANES panel block: a Q6 block's quants (0-63) in 7 bits, Q4_1's
// nibble chunks of their low 4 bits (chunk h, lane r: quants 4h..4h+3 in
// the low nibbles, 16+4h..16+4h+3 in the high ones), then 2 chunks of their
// top 2 bits (chunk t, lane r, byte k: bits 0-1 and 2-3 those of the quants
// in nibble chunk 2t's low and high nibbles, bits 4-5 and 6-7 those of
// chunk 2t + 1's); the rows' pairs of int8 scales (of weights 0-15, of
// 16-31) and the super-block's fp16 d in the header before its first block.
// Q4_K panel block: Q4_1's nibble chunks; the rows' 8-bit scales and mins
// and the super-block's fp16 d and dmin in the header before its first block.
// Q8_0 panel block: chunk g holds, in lane r, row r's weights 4g..4g+3;
// then 16 fp16 d and the 16 rows' sums of the block's weights (int16).
// A row's 4 * `chunks` bytes into its lane r of a panel block (4 bytes in
// each 64-byte chunk), and back.
static void to_lane(uint8_t * panel_block, int r, const uint8_t * bytes, int chunks) {
    for (int g = 0; g < chunks; g++) {
        memcpy(panel_block + 64 * g + 4 * r, bytes + 4 * g, 4);
    }
}

static void from_lane(const uint8_t * panel_block, int r, uint8_t * bytes, int chunks) {
    for (int g = 0; g < chunks; g++) {
        memcpy(bytes + 4 * g, panel_block + 64 * g + 4 * r, 4);
    }
}

// A Q6_PLANES panel block's lane r <-> a row's 32 quants.
static void to_planes(uint8_t * panel_block, int r, const uint8_t * q) {
    for (int h = 0; h < 4; h++) {
        for (int k = 0; k < 4; k++) {
            const int low = 4 * h + k, high = 16 + 4 * h + k;
            panel_block[64 * h + 4 * r + k] = (uint8_t)((q[low] & 0x0F) | ((q[high] & 0x0F) << 4));
            uint8_t * pairs = panel_block + Q6_PLANES_PAIRS + 64 * (h / 2) + 4 * r + k;
            const int shift = 4 * (h % 2);
            *pairs = (uint8_t)((*pairs & ~(0x0F << shift)) | ((q[low] >> 4) << shift) | ((q[high] >> 4) << (shift + 2)));
        }
    }
}

static void from_planes(const uint8_t * panel_block, int r, uint8_t * q) {
    for (int h = 0; h < 4; h++) {
        for (int k = 0; k < 4; k++) {
            const uint8_t nibbles = panel_block[64 * h + 4 * r + k];
            const uint8_t pairs = (uint8_t)(panel_block[Q6_PLANES_PAIRS + 64 * (h / 2) + 4 * r + k] >> (4 * (h % 2)));
            q[4 * h + k] = (uint8_t)((nibbles & 0x0F) | ((pairs & 3) << 4));
            q[16 + 4 * h + k] = (uint8_t)((nibbles >> 4) | (((pairs >> 2) & 3) << 4));
        }
    }
}

static void pack_block(enum ck_format format, const void * src, int64_t cols, int64_t panel, int64_t b,
                       uint8_t * out) {
    if (format == CK_Q6_PLANES && b % CK_SUPER_BLOCKS == 0) {
        // The header's spare bytes, once a super-block: no stale memory in the panels.
        memset(out - past_header(format, b) + Q6_PLANES_SPARE, 0, Q6_PLANES_PANEL_HEADER - Q6_PLANES_SPARE);
    }
    for (int r = 0; r < CK_PANEL_ROWS; r++) {
        const uint8_t * blk = ggml_block(format, src, cols, panel * CK_PANEL_ROWS + r, b);
        if (format == CK_Q4_1) {
            to_lane(out, r, blk + 4, 4);
            memcpy(out + 256 + 2 * r, blk, 2);      // d
            memcpy(out + 288 + 2 * r, blk + 2, 2);  // m
        } else if (format == CK_Q5_1) {
            uint8_t w[CK_BLOCK];
            q5_quants(blk + 4, blk + 8, w);
            to_lane(out, r, w, 8);
            memcpy(out + 512 + 2 * r, blk, 2);      // d
            memcpy(out + 544 + 2 * r, blk + 2, 2);  // m
        } else if (format == CK_Q6_PLANES) {
            to_planes(out, r, blk + 4);
            uint8_t * header = out - past_header(format, b);
            memcpy(header + 2 * r, blk, 2);  // d (each of the super-block's blocks has the same)
            memcpy(header + Q6_PLANES_SCALES(b % CK_SUPER_BLOCKS) + 2 * r, blk + 2, 2);  // the two scales
        } else if (format == CK_Q4_K) {
            to_lane(out, r, blk + 6, 4);
            uint8_t * header = out - past_header(format, b);
            header[Q4_K_SCALES(b % Q4_K_SUPER_BLOCKS) + r] = blk[4];
            header[Q4_K_SCALES(b % Q4_K_SUPER_BLOCKS) + 16 + r] = blk[5];
            memcpy(header + 2 * r, blk, 2);           // d
            memcpy(header + 32 + 2 * r, blk + 2, 2);  // dmin
        } else {
            int16_t sum = 0;
            to_lane(out, r, blk + 2, 8);
            for (int k = 0; k < CK_BLOCK; k++) {
                sum = (int16_t)(sum + (int8_t)blk[2 + k]);
            }
            memcpy(out + 512 + 2 * r, blk, 2);  // d
            memcpy(out + 544 + 2 * r, &sum, 2);
        }
    }
}

static void unpack_block(enum ck_format format, const uint8_t * in, int64_t b, int r, uint8_t * blk) {
    if (format == CK_Q4_1) {
        from_lane(in, r, blk + 4, 4);
        memcpy(blk, in + 256 + 2 * r, 2);
        memcpy(blk + 2, in + 288 + 2 * r, 2);
    } else if (format == CK_Q5_1) {
        uint8_t w[CK_BLOCK];
        from_lane(in, r, w, 8);
        q5_encode(w, blk + 4, blk + 8);
        memcpy(blk, in + 512 + 2 * r, 2);
        memcpy(blk + 2, in + 544 + 2 * r, 2);
    } else if (format == CK_Q6_PLANES) {
        from_planes(in, r, blk + 4);
        const uint8_t * header = in - past_header(format, b);
        memcpy(blk, header + 2 * r, 2);
        memcpy(blk + 2, header + Q6_PLANES_SCALES(b % CK_SUPER_BLOCKS) + 2 * r, 2);
    } else if (format == CK_Q4_K) {
        from_lane(in, r, blk + 6, 4);
        const uint8_t * header = in - past_header(format, b);
        blk[4] = header[Q4_K_SCALES(b % Q4_K_SUPER_BLOCKS) + r];
        blk[5] = header[Q4_K_SCALES(b % Q4_K_SUPER_BLOCKS) + 16 + r];
        memcpy(blk, header + 2 * r, 2);
        memcpy(blk + 2, header + 32 + 2 * r, 2);
    } else {
        from_lane(in, r, blk + 2, 8);
        memcpy(blk, in + 512 + 2 * r, 2);
    }
}

static void unpack_panel_format(enum ck_format format, const void * src, void * dst, int64_t rows, int64_t cols) {
    const int64_t nb = cols / CK_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t * in =
                (const uint8_t *)src + panel_block_offset(format, cols, r / CK_PANEL_ROWS, b);
            unpack_block(format, in, b, (int)(r % CK_PANEL_ROWS), (uint8_t *)ggml_block(format, dst, cols, r, b));
        }
    }
}

// The panel format's ggml blocks of a whole converted matrix, for a while.
static void * converted_buffer(enum ck_format format, int64_t rows, int64_t cols) {
    void * buffer = malloc((size_t)rows * (size_t)(cols / CK_BLOCK) * block_bytes(format));
    if (buffer == NULL) {
        abort();
    }
    return buffer;
}

// Packing runs as a model loads, over every weight: `cortex run` of one
// line on an 8B Q4_K_M model took 16.5 s on one core of two (most of it the
// first writes to the packed weights' fresh pages, and requantizing Q6_K),
// where llama.cpp starts in 4. So a matrix is packed by every core, a range
// of panels each, a panel at a time: its 16 rows converted into a small
// buffer that stays in cache, where the whole matrix was converted into one
// as large as it (pages faulted twice). With convert.c's one-pass Q6_K: 5.8 s.

// One thread's share of a matrix.
struct pack_share {
    enum ck_isa isa;
    int type;
    const uint8_t * src;
    uint8_t * dst;
    int64_t cols;
    int64_t first_panel;
    int64_t end_panel;
};

static void * pack_panels(void * arg) {
    const struct pack_share * share = arg;
    const enum ck_format format = ck_panel_format(share->isa, share->type);
    const int64_t cols = share->cols, nb = cols / CK_BLOCK;
    const bool converted = ck_convertible(share->type);
    const size_t src_row =
        converted ? ggml_row_size((enum ggml_type)share->type, cols) : (size_t)nb * block_bytes(format);
    uint8_t * panel_rows = NULL;
    if (converted && (panel_rows = malloc((size_t)CK_PANEL_ROWS * (size_t)nb * block_bytes(format))) == NULL) {
        abort();
    }
    for (int64_t p = share->first_panel; p < share->end_panel; p++) {
        const uint8_t * rows = share->src + (size_t)p * CK_PANEL_ROWS * src_row;
        if (converted) {
            ck_convert(share->isa, share->type, rows, panel_rows, CK_PANEL_ROWS, cols);
            rows = panel_rows;
        }
        for (int64_t b = 0; b < nb; b++) {
            pack_block(format, rows, cols, 0, b, share->dst + panel_block_offset(format, cols, p, b));
        }
    }
    free(panel_rows);
    return NULL;
}

// The cores this process may run on (at most 16).
static int pack_threads(void) {
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        return n < 1 ? 1 : n > 16 ? 16 : n;
    }
#endif
    return 1;
}

void ck_pack(enum ck_isa isa, int type, const void * src, void * dst, int64_t rows, int64_t cols) {
    const int64_t panels = rows / CK_PANEL_ROWS;
    // A thread for at least 64 panels (1,024 rows): small matrices at once.
    int64_t threads = pack_threads();
    threads = panels / 64 < threads ? panels / 64 : threads;
    threads = threads < 1 ? 1 : threads;
    struct pack_share shares[16];
    pthread_t helpers[16];
    int started = 0;
    for (int64_t t = 0; t < threads; t++) {
        shares[t] = (struct pack_share){
            isa, type, src, dst, cols, panels * t / threads, panels * (t + 1) / threads,
        };
    }
    for (int64_t t = 1; t < threads; t++) {
        if (pthread_create(&helpers[started], NULL, pack_panels, &shares[t]) != 0) {
            pack_panels(&shares[t]);  // no thread to spare: this one packs it
            continue;
        }
        started++;
    }
    pack_panels(&shares[0]);
    for (int t = 0; t < started; t++) {
        pthread_join(helpers[t], NULL);
    }
}

void ck_unpack(enum ck_isa isa, int type, const void * src, void * dst, int64_t rows, int64_t cols) {
    const enum ck_format format = ck_panel_format(isa, type);
    if (!ck_convertible(type)) {
        unpack_panel_format(format, src, dst, rows, cols);
        return;
    }
    void * converted = converted_buffer(format, rows, cols);
    unpack_panel_format(format, src, converted, rows, cols);
    ck_convert_back(isa, type, converted, dst, rows, cols);
    free(converted);
}

void ck_dequantize_row(enum ck_format format, const void * packed, int64_t rows, int64_t cols, int64_t row,
                       float * out) {
    (void)rows;
    uint8_t blk[Q6_BLOCK];  // the largest block
    for (int64_t b = 0; b < cols / CK_BLOCK; b++) {
        const uint8_t * in =
            (const uint8_t *)packed + panel_block_offset(format, cols, row / CK_PANEL_ROWS, b);
        unpack_block(format, in, b, (int)(row % CK_PANEL_ROWS), blk);
        uint16_t dh;
        memcpy(&dh, blk, 2);
        const float d = ck_fp16_to_fp32(dh);
        float * o = out + b * CK_BLOCK;
        if (format == CK_Q4_1) {
            uint16_t mh;
            memcpy(&mh, blk + 2, 2);
            const float m = ck_fp16_to_fp32(mh);
            for (int j = 0; j < 16; j++) {
                o[j] = (float)(blk[4 + j] & 0x0F) * d + m;
                o[j + 16] = (float)(blk[4 + j] >> 4) * d + m;
            }
        } else if (format == CK_Q5_1) {
            uint16_t mh;
            memcpy(&mh, blk + 2, 2);
            const float m = ck_fp16_to_fp32(mh);
            uint8_t w[CK_BLOCK];
            q5_quants(blk + 4, blk + 8, w);
            for (int j = 0; j < CK_BLOCK; j++) {
                o[j] = (float)w[j] * d + m;
            }
        } else if (format == CK_Q6_PLANES) {
            q6_block_values(blk, o);
        } else if (format == CK_Q4_K) {
            q4_k_block_values(blk, o);
        } else {
            for (int j = 0; j < CK_BLOCK; j++) {
                o[j] = (float)(int8_t)blk[2 + j] * d;
            }
        }
    }
}

