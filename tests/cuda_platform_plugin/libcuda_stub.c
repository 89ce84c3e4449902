/* A stand-in libcuda.so.1 for the tests (tests/cuda_platform_plugin): vLLM's GPU package links
 * its extensions against the CUDA driver, so that `import vllm.platforms.cuda` needs a
 * libcuda.so.1 to load. This one reports a driver (13.0) with no device: every call answers
 * CUDA_ERROR_NO_DEVICE (100), so that torch's CUDA runtime sees no GPU and nothing runs on
 * one. Each symbol vLLM 0.33's extensions import, and those the CUDA runtime asks first. */
#include <stddef.h>

#define NO_DEVICE 100

int cuDriverGetVersion(int *version) { if (version) *version = 13000; return 0; }
int cuInit(unsigned int flags) { (void)flags; return NO_DEVICE; }
int cuDeviceGetCount(int *count) { if (count) *count = 0; return NO_DEVICE; }
int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    (void)symbol; (void)version; (void)flags; if (pfn) *pfn = NULL; return NO_DEVICE; }
int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                        int *status) {
    (void)symbol; (void)version; (void)flags; if (pfn) *pfn = NULL; if (status) *status = 0;
    return NO_DEVICE; }
int cuGetErrorString(int error, const char **text) {
    (void)error; if (text) *text = "no CUDA device (fxflops' test stand-in for libcuda)";
    return 0; }

#define NONE(name) int name(void) { return NO_DEVICE; }
NONE(cuCtxGetCurrent) NONE(cuCtxSetCurrent) NONE(cuDeviceGet) NONE(cuDeviceGetAttribute)
NONE(cuDeviceGetName) NONE(cuDevicePrimaryCtxRetain) NONE(cuMemAddressFree)
NONE(cuMemAddressReserve) NONE(cuMemCreate) NONE(cuMemGetAllocationGranularity) NONE(cuMemMap)
NONE(cuMemRelease) NONE(cuMemSetAccess) NONE(cuMemUnmap) NONE(cuPointerGetAttribute)
NONE(cuTensorMapEncodeTiled)
