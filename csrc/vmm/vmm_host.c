/* Host backend: physical blocks are pages of one memfd; a "map" places a block's pages at a fixed
 * address inside a PROT_NONE reservation (MAP_SHARED|MAP_FIXED), an "unmap" puts PROT_NONE back, so
 * a stray access to an unmapped range faults instead of touching whatever is mapped elsewhere. */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "block_arena.h"
#include "vmm_check.h"

static const int reserve_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

int hv_reserve(uint64_t num_bytes, uint64_t *addr_out) {
    void *addr = mmap(NULL, num_bytes, PROT_NONE, reserve_flags, -1, 0);
    if (addr == MAP_FAILED) return errno;
    *addr_out = (uint64_t)(uintptr_t)addr;
    return 0;
}

int hv_release(uint64_t addr, uint64_t num_bytes) {
    CHECK_SYS(munmap((void *)(uintptr_t)addr, num_bytes));
    return 0;
}

int hv_create(uint64_t num_bytes, int64_t *handle_out) {
    int fd = memfd_create("harvest_vmm", MFD_CLOEXEC);
    CHECK_SYS(fd);
    if (ftruncate(fd, (off_t)num_bytes) == -1) {
        int err = errno;
        close(fd);
        return err;
    }
    *handle_out = fd;
    return 0;
}

int hv_destroy(int64_t handle) {
    CHECK_SYS(close((int)handle));
    return 0;
}

int hv_unmap(uint64_t addr, uint64_t num_bytes) {
    void *got = mmap((void *)(uintptr_t)addr, num_bytes, PROT_NONE, reserve_flags | MAP_FIXED, -1, 0);
    if (got == MAP_FAILED) return errno;
    return 0;
}

/* Maps block offsets[i] of the memfd at addr + i * block_bytes; on failure the mapped prefix is
 * returned to PROT_NONE so the range is all-or-nothing. */
int hv_map_blocks(uint64_t addr, uint64_t block_bytes, int64_t handle, const uint64_t *offsets, int64_t num_blocks) {
    for (int64_t i = 0; i < num_blocks; i++) {
        void *at = (void *)(uintptr_t)(addr + (uint64_t)i * block_bytes);
        void *got = mmap(at, block_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, (int)handle,
                         (off_t)offsets[i]);
        if (got == MAP_FAILED) {
            int err = errno;
            if (i) hv_unmap(addr, (uint64_t)i * block_bytes);
            return err;
        }
    }
    return 0;
}

/* Zeroes a mapped range by dropping its memfd pages (MADV_REMOVE): the next access reads fresh zero pages.
 * Costs page-table work, not a memset of the range. */
int hv_zero(uint64_t addr, uint64_t num_bytes) {
    CHECK_SYS(madvise((void *)(uintptr_t)addr, num_bytes, MADV_REMOVE));
    return 0;
}

int hv_page_bytes(uint64_t *out) {
    long page = sysconf(_SC_PAGESIZE);
    CHECK_SYS(page);
    *out = (uint64_t)page;
    return 0;
}

/* Same entry-point signatures as the CUDA pluggable allocator, over the host arena (tests route
 * through them on CPU). */
void *harvest_malloc(ssize_t size, int device, void *stream) {
    (void)device;
    (void)stream;
    return harvest_arena_alloc(size);
}

void harvest_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)size;
    (void)device;
    (void)stream;
    harvest_arena_free(ptr);
}
