// nc_stale.cu - can a load through the non-coherent path (ld.global.nc, what __ldg compiles to) return
// data that a copy overwrote between two kernels?  A standalone probe for kernel-notes v13c: a
// graph-stable task entry read with ld.global.nc failed two test_cuda cases that the same code with a
// plain ld.global passed (the two builds' SASS differ in those loads' cache path only), and the decode
// kernels read page ids with __ldg.
//
// A small buffer (16 KiB: it stays in every SM's L1) holds generation g's pattern; each round, every CTA
// of a grid covering all SMs reads the whole buffer and counts the words that are not generation g's,
// then the buffer is rewritten with generation g + 1 by one of the ways below, and the next round reads.
// Ways to rewrite: a host copy from pageable memory, from page-locked memory, a device kernel; the
// reading kernel launched plainly, as a programmatic dependent (PDL) that waits before it reads, and as
// a CUDA graph replayed after the copy; the loads plain (ld.global), non-coherent (ld.global.nc) and
// non-coherent without L1 allocation (ld.global.nc.L1::no_allocate).  Also a buffer freed and allocated
// again at the same address between rounds.  Prints the stale words seen per case (0 everywhere: the
// non-coherent path is not the difference by itself).
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/cuda/nc_stale.cu -o nc_stale
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.cuh"

constexpr int kWords = 4096; // 16 KiB
constexpr int kRounds = 200;

template <int MODE> __device__ __forceinline__ int32_t load(const int32_t *p) {
    int32_t v;
    if (MODE == 0) asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
    else if (MODE == 1) asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(p));
    else asm volatile("ld.global.nc.L1::no_allocate.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// every CTA reads the whole buffer twice (the second pass hits what the first brought into L1) and
// counts the words that are not gen's
template <int MODE>
__global__ void read_kernel(const int32_t *buf, int32_t gen, unsigned long long *stale, int wait) {
    if (wait) asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = threadIdx.x; i < kWords; i += blockDim.x) n += load<MODE>(buf + i) != gen * kWords + i;
    if (n) atomicAdd(stale, (unsigned long long)n);
}

__global__ void write_kernel(int32_t *buf, int32_t gen) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kWords; i += gridDim.x * blockDim.x) buf[i] = gen * kWords + i;
}

__global__ void trigger_kernel() { asm volatile("griddepcontrol.launch_dependents;"); }

enum Rewrite { kPageable, kPinned, kDevice, kRealloc };
enum Launch { kPlain, kPdl, kGraph };

static const char *rewrite_name[] = {"host copy, pageable", "host copy, page-locked", "device kernel",
                                     "free + malloc, pageable copy"};
static const char *launch_name[] = {"plain launch", "PDL dependent (waits first)", "graph replay"};
static const char *mode_name[] = {"ld.global", "ld.global.nc", "ld.global.nc.L1::no_allocate"};

template <int MODE>
static void launch_read(Launch how, int grid, cudaStream_t s, const int32_t *buf, int32_t gen,
                        unsigned long long *stale) {
    if (how == kPdl) {
        trigger_kernel<<<1, 32, 0, s>>>(); // the primary this read is a programmatic dependent of
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(256);
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, read_kernel<MODE>, buf, gen, stale, 1));
    } else {
        read_kernel<MODE><<<grid, 256, 0, s>>>(buf, gen, stale, 0);
    }
    CK(cudaGetLastError());
}

template <int MODE> static unsigned long long run_case(Rewrite rw, Launch how, int grid) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int32_t *buf;
    CK(cudaMalloc(&buf, kWords * sizeof(int32_t)));
    unsigned long long *stale;
    CK(cudaMalloc(&stale, sizeof *stale));
    CK(cudaMemsetAsync(stale, 0, sizeof *stale, s));
    std::vector<int32_t> host(kWords);
    int32_t *pinned;
    CK(cudaMallocHost(&pinned, kWords * sizeof(int32_t)));
    auto fill = [&](int32_t *dst, int32_t gen) {
        for (int i = 0; i < kWords; i++) dst[i] = gen * kWords + i;
    };
    fill(host.data(), 0);
    CK(cudaMemcpy(buf, host.data(), kWords * sizeof(int32_t), cudaMemcpyHostToDevice));
    // the graph: one read kernel whose expected generation lives in device memory would change the
    // kernel; instead the graph reads and the check compares against the generation passed at capture,
    // so each round captures anew (capture is host work only)
    for (int r = 0; r < kRounds; r++) {
        const int32_t gen = r;
        if (how == kGraph) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            read_kernel<MODE><<<grid, 256, 0, s>>>(buf, gen, stale, 0);
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        } else {
            launch_read<MODE>(how, grid, s, buf, gen, stale);
        }
        // rewrite with the next generation
        if (rw == kRealloc) {
            CK(cudaStreamSynchronize(s));
            int32_t *old = buf;
            CK(cudaFree(buf));
            CK(cudaMalloc(&buf, kWords * sizeof(int32_t)));
            if (buf != old && r == 0) printf("  (free + malloc gave another address)\n");
        }
        if (rw == kDevice) {
            write_kernel<<<8, 256, 0, s>>>(buf, gen + 1);
            CK(cudaGetLastError());
        } else {
            int32_t *src = rw == kPinned ? pinned : host.data();
            if (rw == kPinned) CK(cudaStreamSynchronize(s)); // the page-locked source is reused
            fill(src, gen + 1);
            CK(cudaMemcpyAsync(buf, src, kWords * sizeof(int32_t), cudaMemcpyHostToDevice, s));
        }
    }
    unsigned long long n = 0;
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(&n, stale, sizeof n, cudaMemcpyDeviceToHost));
    CK(cudaFree(buf));
    CK(cudaFree(stale));
    CK(cudaFreeHost(pinned));
    CK(cudaStreamDestroy(s));
    return n;
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int grid = prop.multiProcessorCount * 4;
    printf("# dev/cuda/nc_stale.cu on %s (%d SMs): a 16 KiB buffer rewritten between reading kernels, %d rounds,\n"
           "# every CTA of %d reading it whole twice; stale words seen (of %lld read per case)\n",
           prop.name, prop.multiProcessorCount, kRounds, grid, 2LL * kRounds * grid * kWords);
    printf("| rewrite | reading kernel | %s | %s | %s |\n| --- | --- | ---: | ---: | ---: |\n", mode_name[0],
           mode_name[1], mode_name[2]);
    for (int rw = 0; rw < 4; rw++)
        for (int how = 0; how < 3; how++) {
            if (rw == kRealloc && how != kPlain) continue;
            const unsigned long long a = run_case<0>((Rewrite)rw, (Launch)how, grid);
            const unsigned long long b = run_case<1>((Rewrite)rw, (Launch)how, grid);
            const unsigned long long c = run_case<2>((Rewrite)rw, (Launch)how, grid);
            printf("| %s | %s | %llu | %llu | %llu |\n", rewrite_name[rw], launch_name[how], a, b, c);
        }
    return 0;
}
