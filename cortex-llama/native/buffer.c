// The buffer type of cortex's ggml backend: host memory in which quantized
// weights are stored packed into panels (see kernels.h), packed as
// llama.cpp loads them; every other tensor is plain bytes. Only weights in
// the panel layout are marked (their `extra`), and a weight that arrived
// unpacked (written in pieces, or read straight into memory) is packed
// before its first use.

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"

// The marker in `extra` of a weight stored in the panel layout.
static const char packed_marker = 'P';
static pthread_mutex_t pack_lock = PTHREAD_MUTEX_INITIALIZER;

bool ck_is_packable(const struct ggml_tensor * t) {
    return ck_packable((int)t->type, t->ne[1], t->ne[0]) && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->view_src == NULL && ggml_is_contiguous(t);
}

static bool is_packed(const struct ggml_tensor * t) {
    return __atomic_load_n(&t->extra, __ATOMIC_ACQUIRE) == &packed_marker;
}

static void mark_packed(struct ggml_tensor * t) {
    __atomic_store_n(&t->extra, (void *)&packed_marker, __ATOMIC_RELEASE);
}

// A weight whose bytes arrived in ggml's layout: packed in place, once.
void ck_ensure_packed(struct ggml_tensor * t) {
    if (is_packed(t)) {
        return;
    }
    pthread_mutex_lock(&pack_lock);
    if (!is_packed(t)) {
        const size_t n = ggml_nbytes(t);
        void * raw = malloc(n);
        if (raw == NULL) {
            GGML_ABORT("%s: no memory to pack %s", CK_DEVICE_NAME, t->name);
        }
        memcpy(raw, t->data, n);
        ck_pack(ck_kernels_isa, (int)t->type, raw, t->data, t->ne[1], t->ne[0]);
        free(raw);
        mark_packed(t);
    }
    pthread_mutex_unlock(&pack_lock);
}

// Whether [data, data + size) lies in one read-only mapping of a file
// (llama.cpp maps the GGUF and hands us pointers into it).
static bool in_read_only_file_mapping(const void * data, size_t size) {
#ifdef __linux__
    FILE * maps = fopen("/proc/self/maps", "r");
    if (maps == NULL) {
        return false;
    }
    const uintptr_t begin = (uintptr_t)data, end = begin + size;
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long lo, hi, inode;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %*s %*s %lu", &lo, &hi, perms, &inode) != 4) {
            continue;
        }
        if (begin >= lo && end <= hi) {
            found = inode != 0 && perms[0] == 'r' && perms[1] == '-';
            break;
        }
    }
    fclose(maps);
    return found;
#else
    (void)data, (void)size;
    return false;
#endif
}

// Once a weight is packed, the pages of the file it was read from are not
// read again: let the kernel drop them from this process (they stay in the
// page cache), so the packed copy does not count twice in its memory. On a
// read-only file mapping this loses nothing: a later read maps them again.
static void release_source_pages(const void * data, size_t size) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t begin = ((uintptr_t)data + page - 1) & ~(page - 1);
    const uintptr_t end = ((uintptr_t)data + size) & ~(page - 1);
    if (end > begin && in_read_only_file_mapping(data, size)) {
        madvise((void *)begin, end - begin, MADV_DONTNEED);
    }
}

static void buffer_free(ggml_backend_buffer_t buffer) { free(buffer->context); }

static void * buffer_base(ggml_backend_buffer_t buffer) { return buffer->context; }

static void buffer_memset_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, uint8_t value,
                                 size_t offset, size_t size) {
    (void)buffer;
    memset((char *)tensor->data + offset, value, size);
}

static void buffer_set_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, const void * data,
                              size_t offset, size_t size) {
    if (buffer->usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS && ck_is_packable(tensor) && offset == 0 &&
        size == ggml_nbytes(tensor)) {
        ck_pack(ck_kernels_isa, (int)tensor->type, data, tensor->data, tensor->ne[1], tensor->ne[0]);
        mark_packed(tensor);
        release_source_pages(data, size);
        return;
    }
    memcpy((char *)tensor->data + offset, data, size);
}

static void buffer_get_tensor(ggml_backend_buffer_t buffer, const struct ggml_tensor * tensor, void * data,
                              size_t offset, size_t size) {
    (void)buffer;
    if (!is_packed(tensor)) {
        memcpy(data, (const char *)tensor->data + offset, size);
        return;
    }
    const size_t n = ggml_nbytes(tensor);
    char * raw = malloc(n);
    if (raw == NULL) {
        GGML_ABORT("%s: no memory to read %s", CK_DEVICE_NAME, tensor->name);
    }
    ck_unpack(ck_kernels_isa, (int)tensor->type, tensor->data, raw, tensor->ne[1], tensor->ne[0]);
    memcpy(data, raw + offset, size);
    free(raw);
}

static void buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    memset(buffer->context, value, buffer->size);
}

static const struct ggml_backend_buffer_i buffer_interface = {
    /* .free_buffer   = */ buffer_free,
    /* .get_base      = */ buffer_base,
    /* .init_tensor   = */ NULL,
    /* .memset_tensor = */ buffer_memset_tensor,
    /* .set_tensor    = */ buffer_set_tensor,
    /* .get_tensor    = */ buffer_get_tensor,
    /* .set_tensor_2d = */ NULL,
    /* .get_tensor_2d = */ NULL,
    /* .cpy_tensor    = */ NULL,
    /* .clear         = */ buffer_clear,
    /* .reset         = */ NULL,
};

static const char * buffer_type_name(ggml_backend_buffer_type_t buft) {
    (void)buft;
    return CK_DEVICE_NAME;
}

// A model's weights are read whole at every step: on 2 MiB pages a few TLB
// entries cover them, where 4 KiB pages cost a page walk every 4 KiB read
// (a B = 1 product of weights streaming from memory read 8% faster so, 2
// cores of Zen 5). Where the kernel offers such pages only on request
// (transparent huge pages set to `madvise`), a big buffer asks.
#define CK_HUGE_PAGE ((size_t)2 << 20)

static ggml_backend_buffer_t buffer_type_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    void * data = NULL;
    // At least one line, so that even an empty buffer has a base.
    const size_t bytes = (size + CK_ALIGNMENT - 1) / CK_ALIGNMENT * CK_ALIGNMENT + CK_ALIGNMENT;
    const bool huge = bytes >= CK_HUGE_PAGE;
    const size_t alignment = huge ? CK_HUGE_PAGE : CK_ALIGNMENT;
    const size_t allocated = huge ? (bytes + CK_HUGE_PAGE - 1) / CK_HUGE_PAGE * CK_HUGE_PAGE : bytes;
    if (posix_memalign(&data, alignment, allocated) != 0) {
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (huge) {
        madvise(data, allocated, MADV_HUGEPAGE);  // a hint: refused, the buffer works as it is
    }
#endif
    return ggml_backend_buffer_init(buft, buffer_interface, data, size);
}

static size_t buffer_type_alignment(ggml_backend_buffer_type_t buft) {
    (void)buft;
    return CK_ALIGNMENT;
}

static size_t buffer_type_alloc_size(ggml_backend_buffer_type_t buft, const struct ggml_tensor * tensor) {
    (void)buft;
    if (ck_is_packable(tensor)) {
        return ck_packed_size(ck_kernels_isa, (int)tensor->type, tensor->ne[1], tensor->ne[0]);
    }
    return ggml_nbytes(tensor);
}

static bool buffer_type_is_host(ggml_backend_buffer_type_t buft) {
    (void)buft;
    return true;
}

struct ggml_backend_buffer_type ck_buffer_type = {
    /* .iface   = */ {
        /* .get_name         = */ buffer_type_name,
        /* .alloc_buffer     = */ buffer_type_alloc,
        /* .alloc_buffer_n   = */ NULL,
        /* .get_alignment    = */ buffer_type_alignment,
        /* .get_max_size     = */ NULL,
        /* .get_alloc_size   = */ buffer_type_alloc_size,
        /* .get_alloc_size_n = */ NULL,
        /* .is_host          = */ buffer_type_is_host,
    },
    /* .device  = */ NULL,  // set at registration
    /* .context = */ NULL,
};

bool ck_in_buffer_type(const struct ggml_tensor * t) {
    return t->buffer != NULL && t->buffer->buft == &ck_buffer_type;
}

