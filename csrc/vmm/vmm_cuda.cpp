// CUDA backend: each physical block is one cuMemCreate allocation (cuMemMap takes offset 0 only);
// blocks are mapped at fixed addresses inside cuMemAddressReserve ranges, many per call (Python makes one
// call per chunk or tensor, not one per block). Driver entry points are
// resolved with dlsym at hc_init, so the library loads on hosts without a driver and CI can build it
// without libcuda's link stub; hc_init then reports the failure as a code.
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>

#define XSTR(x) STR(x)
#define STR(x) #x

// Codes above every CUresult: library not found / symbol missing.
enum { HC_NO_DRIVER = 100000, HC_NO_SYMBOL = 100001, HC_NOT_INITIALISED = 100002 };

#define DRIVER_FUNCTIONS(X)                \
    X(cuInit)                              \
    X(cuDeviceGet)                         \
    X(cuDeviceGetAttribute)                \
    X(cuDevicePrimaryCtxRetain)            \
    X(cuCtxSetCurrent)                     \
    X(cuMemGetAllocationGranularity)       \
    X(cuMemAddressReserve)                 \
    X(cuMemAddressFree)                    \
    X(cuMemCreate)                         \
    X(cuMemRelease)                        \
    X(cuMemMap)                            \
    X(cuMemUnmap)                          \
    X(cuMemSetAccess)

#define DECLARE_POINTER(name) static decltype(&name) p_##name = nullptr;
DRIVER_FUNCTIONS(DECLARE_POINTER)

#define CHECK_DRV(call)                                   \
    do {                                                  \
        if (!p_cuInit) return HC_NOT_INITIALISED;         \
        CUresult _rc = (call);                            \
        if (_rc != CUDA_SUCCESS) return (int)_rc;         \
    } while (0)

static CUdevice device_handle = 0;
static CUcontext primary_context = nullptr;
// Blocks are created RDMA-capable where the device supports it with VMM: SGLang's PD transfer backends
// (mooncake, nixl) register the KV pool with the NIC.
static int rdma_capable = 0;

// Driver calls need a current context and Python may call from any thread: make the primary one current.
#define ENSURE_CONTEXT() CHECK_DRV(p_cuCtxSetCurrent(primary_context))

static CUmemAllocationProp allocation_prop(int device) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.allocFlags.gpuDirectRDMACapable = (unsigned char)rdma_capable;
    return prop;
}

extern "C" {

int hc_init(int device) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return HC_NO_DRIVER;
#define RESOLVE(name)                                                        \
    p_##name = reinterpret_cast<decltype(&name)>(dlsym(lib, XSTR(name)));    \
    if (!p_##name) { p_cuInit = nullptr; return HC_NO_SYMBOL; }
    DRIVER_FUNCTIONS(RESOLVE)
#undef RESOLVE
    CHECK_DRV(p_cuInit(0));
    CHECK_DRV(p_cuDeviceGet(&device_handle, device));
    CHECK_DRV(p_cuDevicePrimaryCtxRetain(&primary_context, device_handle));
    CHECK_DRV(p_cuDeviceGetAttribute(&rdma_capable, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                     device_handle));
    ENSURE_CONTEXT();
    return 0;
}

int hc_rdma_capable(int device, int *out) {
    (void)device;
    if (!p_cuInit) return HC_NOT_INITIALISED;
    *out = rdma_capable;
    return 0;
}

int hc_granularity(int device, uint64_t *out) {
    ENSURE_CONTEXT();
    CUmemAllocationProp prop = allocation_prop(device);
    size_t granularity = 0;
    CHECK_DRV(p_cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    *out = granularity;
    return 0;
}

int hc_reserve(uint64_t num_bytes, uint64_t alignment, uint64_t *addr_out) {
    ENSURE_CONTEXT();
    CUdeviceptr addr = 0;
    CHECK_DRV(p_cuMemAddressReserve(&addr, num_bytes, alignment, 0, 0));
    *addr_out = addr;
    return 0;
}

int hc_release(uint64_t addr, uint64_t num_bytes) {
    ENSURE_CONTEXT();
    CHECK_DRV(p_cuMemAddressFree(addr, num_bytes));
    return 0;
}

// Creates num_handles physical allocations of block_bytes each; on failure frees those made so far.
int hc_create_blocks(uint64_t block_bytes, int device, uint64_t *handles_out, int64_t num_handles) {
    ENSURE_CONTEXT();
    CUmemAllocationProp prop = allocation_prop(device);
    for (int64_t i = 0; i < num_handles; i++) {
        CUmemGenericAllocationHandle handle;
        CUresult rc = p_cuInit ? p_cuMemCreate(&handle, block_bytes, &prop, 0) : CUDA_ERROR_NOT_INITIALIZED;
        if (rc != CUDA_SUCCESS) {
            for (int64_t j = 0; j < i; j++) p_cuMemRelease(handles_out[j]);
            return p_cuInit ? (int)rc : HC_NOT_INITIALISED;
        }
        handles_out[i] = handle;
    }
    return 0;
}

int hc_destroy_blocks(const uint64_t *handles, int64_t num_handles) {
    ENSURE_CONTEXT();
    for (int64_t i = 0; i < num_handles; i++) CHECK_DRV(p_cuMemRelease(handles[i]));
    return 0;
}

// One block per cuMemUnmap: cuMemUnmap cannot split a mapping, and each block was mapped on its own.
int hc_unmap(uint64_t addr, uint64_t num_bytes, uint64_t block_bytes) {
    ENSURE_CONTEXT();
    for (uint64_t at = addr; at < addr + num_bytes; at += block_bytes) CHECK_DRV(p_cuMemUnmap(at, block_bytes));
    return 0;
}

// Unmaps one block at each of addrs[0..num_blocks) (a chunk's blocks, one per K/V buffer).
int hc_unmap_blocks(const uint64_t *addrs, int64_t num_blocks, uint64_t block_bytes) {
    ENSURE_CONTEXT();
    for (int64_t i = 0; i < num_blocks; i++) CHECK_DRV(p_cuMemUnmap(addrs[i], block_bytes));
    return 0;
}

// Maps handles[i] at addrs[i] with read/write access for device; all-or-nothing.
int hc_map_blocks_at(const uint64_t *addrs, uint64_t block_bytes, const uint64_t *handles, int64_t num_blocks,
                     int device) {
    ENSURE_CONTEXT();
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int64_t i = 0; i < num_blocks; i++) {
        CUresult rc = p_cuMemMap(addrs[i], block_bytes, 0, handles[i], 0);
        if (rc == CUDA_SUCCESS) rc = p_cuMemSetAccess(addrs[i], block_bytes, &access, 1);
        if (rc != CUDA_SUCCESS) {
            for (int64_t j = 0; j <= i; j++) p_cuMemUnmap(addrs[j], block_bytes);
            return (int)rc;
        }
    }
    return 0;
}

// Maps handles[i] at addr + i * block_bytes, one cuMemSetAccess for the whole range; all-or-nothing.
int hc_map_blocks(uint64_t addr, uint64_t block_bytes, const uint64_t *handles, int64_t num_blocks, int device) {
    ENSURE_CONTEXT();
    for (int64_t i = 0; i < num_blocks; i++) {
        CUresult rc = p_cuMemMap(addr + i * block_bytes, block_bytes, 0, handles[i], 0);
        if (rc != CUDA_SUCCESS) {
            for (int64_t j = 0; j < i; j++) p_cuMemUnmap(addr + j * block_bytes, block_bytes);
            return (int)rc;
        }
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult rc = p_cuMemSetAccess(addr, num_blocks * block_bytes, &access, 1);
    if (rc != CUDA_SUCCESS) {
        for (int64_t j = 0; j < num_blocks; j++) p_cuMemUnmap(addr + j * block_bytes, block_bytes);
        return (int)rc;
    }
    return 0;
}

}  // extern "C"
