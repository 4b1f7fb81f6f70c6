#include "block_arena.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANGES 1024

typedef struct {
    uint64_t addr;
    uint64_t num_bytes;
} span;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t block_bytes = 2u << 20;
static span ranges[MAX_RANGES];
static int64_t num_ranges = 0;
/* Live allocations sorted by address; grows by doubling. */
static span *live = NULL;
static int64_t num_live = 0;
static int64_t live_capacity = 0;

static int64_t first_live_at_or_after(uint64_t addr) {
    int64_t lo = 0, hi = num_live;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (live[mid].addr < addr) lo = mid + 1; else hi = mid;
    }
    return lo;
}

int harvest_arena_configure(uint64_t new_block_bytes) {
    if (new_block_bytes == 0) return EINVAL;
    pthread_mutex_lock(&lock);
    int rc = 0;
    if (num_ranges || num_live) rc = EBUSY; else block_bytes = new_block_bytes;
    pthread_mutex_unlock(&lock);
    return rc;
}

int harvest_arena_add(uint64_t addr, uint64_t num_bytes) {
    if (num_bytes == 0 || addr % block_bytes || num_bytes % block_bytes) return EINVAL;
    pthread_mutex_lock(&lock);
    int rc = 0;
    if (num_ranges == MAX_RANGES) rc = ENOSPC;
    for (int64_t i = 0; i < num_ranges && !rc; i++)
        if (addr < ranges[i].addr + ranges[i].num_bytes && ranges[i].addr < addr + num_bytes) rc = EEXIST;
    if (!rc) ranges[num_ranges++] = (span){addr, num_bytes};
    pthread_mutex_unlock(&lock);
    return rc;
}

int harvest_arena_remove(uint64_t addr, uint64_t num_bytes) {
    pthread_mutex_lock(&lock);
    int rc = ENOENT;
    for (int64_t i = 0; i < num_ranges; i++) {
        if (ranges[i].addr != addr || ranges[i].num_bytes != num_bytes) continue;
        int64_t j = first_live_at_or_after(addr);
        if (j < num_live && live[j].addr < addr + num_bytes) { rc = EBUSY; break; }
        ranges[i] = ranges[--num_ranges];
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int harvest_arena_stats(uint64_t *range_bytes_out, uint64_t *used_bytes_out, uint64_t *num_live_out) {
    pthread_mutex_lock(&lock);
    uint64_t range_bytes = 0, used = 0;
    for (int64_t i = 0; i < num_ranges; i++) range_bytes += ranges[i].num_bytes;
    for (int64_t i = 0; i < num_live; i++) used += live[i].num_bytes;
    *range_bytes_out = range_bytes;
    *used_bytes_out = used;
    *num_live_out = (uint64_t)num_live;
    pthread_mutex_unlock(&lock);
    return 0;
}

static int insert_live(int64_t at, uint64_t addr, uint64_t num_bytes) {
    if (num_live == live_capacity) {
        int64_t capacity = live_capacity ? 2 * live_capacity : 256;
        span *grown = realloc(live, (size_t)capacity * sizeof(span));
        if (!grown) return ENOMEM;
        live = grown;
        live_capacity = capacity;
    }
    memmove(live + at + 1, live + at, (size_t)(num_live - at) * sizeof(span));
    live[at] = (span){addr, num_bytes};
    num_live++;
    return 0;
}

void *harvest_arena_alloc(ssize_t size) {
    if (size <= 0) return NULL;
    uint64_t need = ((uint64_t)size + block_bytes - 1) / block_bytes * block_bytes;
    void *result = NULL;
    pthread_mutex_lock(&lock);
    for (int64_t i = 0; i < num_ranges && !result; i++) {
        uint64_t cursor = ranges[i].addr, end = ranges[i].addr + ranges[i].num_bytes;
        int64_t j = first_live_at_or_after(cursor);
        for (;; j++) {
            uint64_t gap_end = (j < num_live && live[j].addr < end) ? live[j].addr : end;
            if (gap_end - cursor >= need) {
                if (insert_live(j, cursor, need) == 0) result = (void *)(uintptr_t)cursor;
                break;
            }
            if (gap_end == end) break;
            cursor = live[j].addr + live[j].num_bytes;
        }
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int harvest_arena_free(void *ptr) {
    uint64_t addr = (uint64_t)(uintptr_t)ptr;
    pthread_mutex_lock(&lock);
    int64_t j = first_live_at_or_after(addr);
    int rc = ENOENT;
    if (j < num_live && live[j].addr == addr) {
        memmove(live + j, live + j + 1, (size_t)(num_live - j - 1) * sizeof(span));
        num_live--;
        rc = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
