// read_patterns.cu - how fast can the KV bytes of a decode step be read off scattered NHD pages,
// by access pattern, with no attention math?  A standalone probe for the next kernel version:
//
//   stream      a contiguous read of the same bytes (and of 4 GiB: the read ceiling)
//   page        a warp per whole 32 KiB page, 8 16-byte loads in flight per lane (pkv's pages floor)
//   head-ldg    the decode kernel's mapping: a CTA of 4 warps per (row, KV head, split), a warp per
//               16-token tile (a page's 256-byte head vectors of K and V: 8 KiB), page ids one tile
//               group ahead; 'window': as ptxas schedules it (about 4 loads per thread in flight),
//               'U=1/2 fenced': all loads of U tiles issued before any is consumed (the decode
//               kernel's 8 KiB per warp, and twice that)
//   head-cp S   the same mapping with cp.async (16 bytes per instruction) into S stages of 8 KiB per warp
//   head-bulk S the same mapping with cp.async.bulk (one 256-byte bulk copy per lane and tile, the
//               completion counted on an mbarrier) into S shared-memory stages per warp; the copy's
//               addresses are uniform-register operands, so ptxas issues the 32 lanes' copies one
//               after another in a loop (harmless here, where nothing else is issued; not in a kernel)
//
// Shape: the paper shape (Hkv 8, d 128, fp16, page 16 tokens, NHD: a K page is 32 KiB), pages drawn
// without repetition from a 16 GiB K pool and a 16 GiB V pool (anchors.md: a 32 GiB pool), rows of
// 2048 pages (32K tokens): 16 rows = 2.15 GB (B16_homo32K), 1 row = 134 MB (B1_N32768).  Time: CUDA
// events around each run, median of 30.  Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//   -Iinclude -Isrc/core -Isrc/cuda dev/cuda/read_patterns.cu -o read_patterns
#include <cuda_runtime.h>

#include "cuda_common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <cmath>
#include <cuda_fp16.h>
#include <vector>

#include "check.cuh"

constexpr int kHeads = 8;
constexpr int kTokBytes = 256;                  // one head vector: d 128 x 2 bytes
constexpr int kPageBytes = 16 * kHeads * kTokBytes; // 32 KiB
constexpr int kPageVec = kPageBytes / 16;
constexpr int kWarps = 4;

using pkv::ldg_nc_v4; // the library's 16-byte load (L1 bypassed), the one the decode kernels issue

__global__ void stream_kernel(const uint4 *src, int64_t n, uint32_t *sink) {
    pkv::pdl_launch_dependents(); // a no-op without a programmatic dependent (the bound section's merge)
    uint32_t x = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i + 7 * stride < n; i += 8 * stride) {
        uint4 r[8];
#pragma unroll
        for (int u = 0; u < 8; u++) r[u] = ldg_nc_v4(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < 8; u++) x ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 a = ldg_nc_v4(src + i);
        x ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (x == 0x9e3779b9u) *sink = x;
}

// a warp per whole page (K or V), 8 loads in flight per lane
__global__ void page_kernel(const int32_t *ids, int64_t npages, const uint4 *k, const uint4 *v, uint32_t *sink) {
    pkv::pdl_launch_dependents();
    uint32_t x = 0;
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t it = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; it < 2 * npages; it += warps) {
        const uint4 *src = ((it & 1) ? v : k) + (int64_t)__ldg(ids + (it >> 1)) * kPageVec;
        for (int i = lane; i < kPageVec; i += 8 * 32) {
            uint4 r[8];
#pragma unroll
            for (int u = 0; u < 8; u++) r[u] = ldg_nc_v4(src + i + u * 32);
#pragma unroll
            for (int u = 0; u < 8; u++) x ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
        }
    }
    if (x == 0x9e3779b9u) *sink = x;
}

// CTA (row, KV head, split) of a head kernel: the head, the split's pages [p0, p1) of the row, and the
// row's page ids.
struct cta_pages {
    int head, p0, p1;
    const int32_t *rid;
    __device__ cta_pages(const int32_t *ids, int pages_per_row, int splits) {
        const int row = blockIdx.x / (kHeads * splits), sp = blockIdx.x % splits;
        const int per = (pages_per_row + splits - 1) / splits;
        head = (blockIdx.x / splits) % kHeads;
        p0 = sp * per;
        p1 = min(p0 + per, pages_per_row);
        rid = ids + (int64_t)row * pages_per_row;
    }
};

// A lane's 16-byte vectors j = lane + 32 u (u < 8) of a tile's K (or V) for one head: token j / 16,
// piece j % 16 of the head vector, as offsets in 16-byte units from the page.
__device__ __forceinline__ void tile_vectors(int lane, int head, int64_t (&off)[8]) {
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int j = lane + 32 * u;
        off[u] = (int64_t)(j >> 4) * (kHeads * kTokBytes / 16) + head * (kTokBytes / 16) + (j & 15);
    }
}

// CTA (row, head, split) of 4 warps; warp w reads pages w, w + 4, ... of its split for its head:
// K and V of 16 tokens x 256 bytes = 16 x 16 vectors each, a lane the vectors of tile_vectors.
template <int U, bool FENCE>
__global__ void __launch_bounds__(128) head_ldg_kernel(const int32_t *ids, int pages_per_row, int splits,
                                                      const uint4 *k, const uint4 *v, uint32_t *sink) {
    const cta_pages cp(ids, pages_per_row, splits);
    const int head = cp.head, p0 = cp.p0, p1 = cp.p1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t *rid = cp.rid;
    uint32_t x = 0;
    int64_t off[8];
    tile_vectors(lane, head, off);
    int32_t nid[U];
#pragma unroll
    for (int t = 0; t < U; t++) {
        const int pg = p0 + warp + t * kWarps;
        nid[t] = pg < p1 ? __ldg(rid + pg) : -1;
    }
    for (int base = p0 + warp; base < p1; base += U * kWarps) {
        int32_t id[U];
#pragma unroll
        for (int t = 0; t < U; t++) id[t] = nid[t];
#pragma unroll
        for (int t = 0; t < U; t++) { // the next group's ids, in flight with this group's data
            const int pg = base + (U + t) * kWarps;
            nid[t] = pg < p1 ? __ldg(rid + pg) : -1;
        }
        uint4 r[U][16];
#pragma unroll
        for (int t = 0; t < U; t++)
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int64_t pbase = (int64_t)(id[t] < 0 ? 0 : id[t]) * kPageVec;
                r[t][u] = id[t] >= 0 ? ldg_nc_v4(k + pbase + off[u]) : make_uint4(0, 0, 0, 0);
                r[t][8 + u] = id[t] >= 0 ? ldg_nc_v4(v + pbase + off[u]) : make_uint4(0, 0, 0, 0);
            }
        // FENCE: every load of the group is issued before any is consumed (without it ptxas keeps a
        // rolling window of about 4 loads per thread in flight, as in the stream kernel)
        if constexpr (FENCE) __threadfence_block();
#pragma unroll
        for (int t = 0; t < U; t++)
#pragma unroll
            for (int u = 0; u < 16; u++) x ^= r[t][u].x ^ r[t][u].y ^ r[t][u].z ^ r[t][u].w;
    }
    if (x == 0x9e3779b9u) *sink = x;
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// arrive (the bound section; NULL elsewhere): at its end the CTA counts itself on its KV head's word
// (release), as the fused route's decode CTAs do
__device__ __forceinline__ void count_arrival(int *arrive, int head) {
    if (!arrive) return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrive + head, 1);
    }
}

// The same mapping with cp.async (16 bytes per instruction, L2 only) into S shared-memory stages of
// 8 KiB per warp: lane l copies vectors l + 32 u of the tile's K and V (as head-ldg); one commit group
// per tile; the warp waits for the oldest group, then refills its stage.  Nothing reads the stages.
// arrive: see count_arrival.
template <int S>
__global__ void __launch_bounds__(128) head_cp_kernel(const int32_t *ids, int pages_per_row, int splits,
                                                     const uint4 *k, const uint4 *v, uint32_t *sink, int *arrive) {
    extern __shared__ __align__(128) unsigned char sm[];
    pkv::pdl_launch_dependents();
    const cta_pages cp(ids, pages_per_row, splits);
    const int head = cp.head, p0 = cp.p0, p1 = cp.p1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t *rid = cp.rid;
    unsigned char *wsm = sm + (size_t)warp * S * 8192;
    int64_t off[8];
    tile_vectors(lane, head, off);
    auto issue = [&](int s, int32_t id) {
        const int64_t pbase = (int64_t)id * kPageVec;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const uint32_t dk = smem_addr(wsm + s * 8192 + (lane + 32 * u) * 16);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dk), "l"(k + pbase + off[u]) : "memory");
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dk + 4096), "l"(v + pbase + off[u]) : "memory");
        }
    };
    const int ntiles = p1 - p0 > warp ? (p1 - p0 - warp + kWarps - 1) / kWarps : 0;
    for (int t = 0; t < S; t++) {
        if (t < ntiles) issue(t, __ldg(rid + p0 + warp + t * kWarps));
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    int32_t next_id = ntiles > S ? __ldg(rid + p0 + warp + S * kWarps) : 0;
    for (int t = 0; t < ntiles; t++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory"); // tile t has landed
        if (t + S < ntiles) {
            const int32_t id = next_id;
            if (t + S + 1 < ntiles) next_id = __ldg(rid + p0 + warp + (t + S + 1) * kWarps);
            issue(t % S, id);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (ntiles < 0) *sink = 1;
    count_arrival(arrive, head);
}

// The same mapping with bulk copies: lane l copies the 256-byte head vector of token l (K, l < 16)
// or l - 16 (V) of the tile into stage s; lane 0 arms the stage's mbarrier with 8 KiB.  S stages per
// warp; a stage is re-armed as soon as its previous contents have landed (nothing reads them: this
// measures the copy rate alone).
template <int S>
__global__ void __launch_bounds__(128) head_bulk_kernel(const int32_t *ids, int pages_per_row, int splits,
                                                       const char *k, const char *v, uint32_t *sink, int *arrive) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) uint64_t bars[kWarps][S];
    const cta_pages cp(ids, pages_per_row, splits);
    const int head = cp.head, p0 = cp.p0, p1 = cp.p1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t *rid = cp.rid;
    unsigned char *wsm = sm + (size_t)warp * S * 8192;
    if (lane == 0)
        for (int s = 0; s < S; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[warp][s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    const int64_t tok_off = (int64_t)(lane & 15) * (kHeads * kTokBytes) + head * kTokBytes;
    const char *pool = lane < 16 ? k : v;
    auto issue = [&](int s, int32_t id) {
        const uint32_t bar = smem_addr(&bars[warp][s]);
        if (lane == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 8192;" ::"r"(bar) : "memory");
        __syncwarp();
        const char *src = pool + (int64_t)id * kPageBytes + tok_off;
        const uint32_t dst = smem_addr(wsm + s * 8192 + lane * 256);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 256, [%2];" ::"r"(dst),
                     "l"(src), "r"(bar)
                     : "memory");
    };
    auto wait = [&](int s, uint32_t parity) {
        const uint32_t bar = smem_addr(&bars[warp][s]);
        uint32_t done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done)
                         : "r"(bar), "r"(parity)
                         : "memory");
    };
    const int ntiles = p1 - p0 > warp ? (p1 - p0 - warp + kWarps - 1) / kWarps : 0; // this warp's tiles
    int32_t next_id = ntiles > S ? __ldg(rid + p0 + warp + S * kWarps) : 0;
    for (int t = 0; t < S && t < ntiles; t++) issue(t, __ldg(rid + p0 + warp + t * kWarps));
    uint32_t phase = 0; // bit s: the parity stage s waits for
    for (int t = 0; t < ntiles; t++) {
        const int s = t % S;
        wait(s, (phase >> s) & 1);
        phase ^= 1u << s;
        if (t + S < ntiles) {
            const int32_t id = next_id;
            if (t + S + 1 < ntiles) next_id = __ldg(rid + p0 + warp + (t + S + 1) * kWarps);
            issue(s, id);
        }
    }
    if (ntiles < 0) *sink = 1;
    count_arrival(arrive, head);
}

struct timer {
    cudaEvent_t a, b;
    timer() {
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
    }
    template <typename F> double median_us(F launch, int reps = 30) {
        for (int i = 0; i < 3; i++) launch();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<double> v;
        for (int i = 0; i < reps; i++) {
            CK(cudaEventRecord(a));
            launch();
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            v.push_back(ms * 1e3);
        }
        CK(cudaGetLastError());
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    }
};


// The probes' buffers: K and V pools of 16 GiB each (pages of 32 KiB, filled), a 4 GiB stream buffer, a
// sink, and kRows rows of kPagesPerRow page ids drawn without repetition from a seeded permutation.
struct probe_buffers {
    static constexpr int64_t kPoolPages = (int64_t)1 << 19;
    static constexpr int kPagesPerRow = 2048, kRows = 64;
    const size_t pool_bytes = (size_t)kPoolPages * kPageBytes, stream_bytes = (size_t)4 << 30;
    char *k = nullptr, *v = nullptr, *buf = nullptr;
    uint32_t *sink = nullptr;
    int32_t *ids = nullptr;
    probe_buffers() {
        CK(cudaMalloc(&k, pool_bytes));
        CK(cudaMalloc(&v, pool_bytes));
        CK(cudaMemset(k, 0x3c, pool_bytes));
        CK(cudaMemset(v, 0x5a, pool_bytes));
        CK(cudaMalloc(&buf, stream_bytes));
        CK(cudaMemset(buf, 0x11, stream_bytes));
        CK(cudaMalloc(&sink, 4));
        std::mt19937_64 rng(20261129);
        std::vector<int32_t> perm(kPoolPages);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        const size_t n = (size_t)kRows * kPagesPerRow;
        CK(cudaMalloc(&ids, n * sizeof(int32_t)));
        CK(cudaMemcpy(ids, perm.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
};

// ---- the bound section (argument "bound"): the fastest split decode of B1_N32768 conceivable -------------
// A split decode of one row is a grid that reads the row's K and V, then a merge of the splits' partial
// states that cannot start before that grid has completed.  Here the read is a kernel with no attention
// math at all (a contiguous stream of the same bytes; the pages floor's warp per page; the decode's own
// mapping by cp.async, 2 per SM), and the merge the cheapest dependent one: the library's per-head
// merge launched as a programmatic dependent (PDL) of the read, one CTA per (KV head, query head)
// loading its 33 states of the paper shape in one batch and combining them - what pkv's split route
// does after its decode.  Timed as pkv bench times a step: runs queued behind a spin, CUDA events
// around each, each run on a different row of pages (a different 134 MB of the stream buffer), so L2
// does not help; median of 200.

constexpr int kStates = 33; // the split route's splits of B1_N32768 (264 CTAs = 8 KV heads x 33)
constexpr int kMergeGroups = 4, kPerGroup = (kStates + kMergeGroups - 1) / kMergeGroups;

// CTA m = (KV head, query head) of 8 x 4; thread (group, float4 column of d 128)
// arrive NULL: the merge waits for the read's grid to complete (griddepcontrol.wait, pkv's merge kernels);
// otherwise it spins until its KV head's word counts every split (acquire): legal because a programmatic
// dependent is launched only once every CTA of the grid before it has started (each triggers at its start)
__global__ void __launch_bounds__(128) merge_standin_kernel(const float4 *state_o, const float *state_lse,
                                                            __half *o, const int *arrive) {
    if (!arrive) {
        pkv::pdl_wait();
    } else {
        if (threadIdx.x == 0) {
            int n = 0;
            do asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(n) : "l"(arrive + blockIdx.x / 4) : "memory");
            while (n < kStates);
        }
        __syncthreads();
    }
    __shared__ float4 acc_s[kMergeGroups][32];
    __shared__ float mx_s[kMergeGroups], sum_s[kMergeGroups];
    const int m = blockIdx.x, grp = threadIdx.x >> 5, col = threadIdx.x & 31;
    float4 st[kPerGroup];
    float l[kPerGroup];
#pragma unroll
    for (int i = 0; i < kPerGroup; i++) { // every load of the batch issued before any use
        const int j = grp + kMergeGroups * i;
        st[i] = j < kStates ? state_o[((size_t)m * kStates + j) * 32 + col] : make_float4(0, 0, 0, 0);
        l[i] = j < kStates ? state_lse[m * kStates + j] : -INFINITY;
    }
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerGroup; i++) mx = fmaxf(mx, l[i]);
    float sum = 0;
    float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kPerGroup; i++) {
        const float w = l[i] == -INFINITY ? 0.f : exp2f(l[i] - mx);
        sum += w;
        acc.x += w * st[i].x, acc.y += w * st[i].y, acc.z += w * st[i].z, acc.w += w * st[i].w;
    }
    acc_s[grp][col] = acc;
    if (col == 0) mx_s[grp] = mx, sum_s[grp] = sum;
    __syncthreads();
    if (grp != 0) return;
    float gm = -INFINITY;
    for (int g = 0; g < kMergeGroups; g++) gm = fmaxf(gm, mx_s[g]);
    float tot = 0;
    float4 r = make_float4(0, 0, 0, 0);
    for (int g = 0; g < kMergeGroups; g++) {
        const float w = exp2f(mx_s[g] - gm);
        tot += w * sum_s[g];
        const float4 a = acc_s[g][col];
        r.x += w * a.x, r.y += w * a.y, r.z += w * a.z, r.w += w * a.w;
    }
    const float inv = 1.f / tot;
    __half2 *out = reinterpret_cast<__half2 *>(o + (size_t)m * 128 + col * 4);
    out[0] = __floats2half2_rn(r.x * inv, r.y * inv);
    out[1] = __floats2half2_rn(r.z * inv, r.w * inv);
}

__global__ void spin_ns_kernel(int64_t ns) {
    uint64_t t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    while ((int64_t)(t1 - t0) < ns);
}

// median over reps of run(r) timed as pkv bench times a step (devtools.cu time_runs)
template <typename F> double queued_median_us(cudaStream_t s, F run, int reps = 200) {
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    for (int r = 0; r < 4; r++) run(r);
    CK(cudaStreamSynchronize(s));
    for (int r = 0; r < reps; r++) {
        if (r % 16 == 0) spin_ns_kernel<<<1, 1, 0, s>>>(120000);
        CK(cudaEventRecord(ev[2 * r], s));
        run(r);
        CK(cudaEventRecord(ev[2 * r + 1], s));
    }
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    std::vector<double> v;
    for (int r = 0; r < reps; r++) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[2 * r], ev[2 * r + 1]));
        v.push_back(ms * 1e3);
    }
    for (auto &e : ev) CK(cudaEventDestroy(e));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int bound_main(int sms, const cudaDeviceProp &prop) {
    const probe_buffers pb;
    char *k = pb.k, *v = pb.v, *buf = pb.buf;
    uint32_t *sink = pb.sink;
    const int32_t *ids = pb.ids;
    const size_t stream_bytes = pb.stream_bytes;
    const int pages_per_row = probe_buffers::kPagesPerRow, rows = probe_buffers::kRows;
    std::mt19937_64 rng(20261203);
    // the merge's inputs: 32 (KV head, query head) x 33 states, random values, finite lse
    const int merges = kHeads * 4;
    std::vector<float> h_o((size_t)merges * kStates * 128), h_l((size_t)merges * kStates);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto &x : h_o) x = u(rng);
    for (auto &x : h_l) x = 10.f + u(rng);
    float *d_o = nullptr, *d_l = nullptr;
    __half *out = nullptr;
    CK(cudaMalloc(&d_o, h_o.size() * sizeof(float)));
    CK(cudaMalloc(&d_l, h_l.size() * sizeof(float)));
    CK(cudaMalloc(&out, (size_t)merges * 128 * sizeof(__half)));
    CK(cudaMemcpy(d_o, h_o.data(), h_o.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_l, h_l.data(), h_l.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaLaunchAttribute pdl[1];
    pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl[0].val.programmaticStreamSerializationAllowed = 1;
    auto merge = [&](const int *arrive) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(merges);
        cfg.blockDim = dim3(128);
        cfg.stream = s;
        cfg.attrs = pdl;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, merge_standin_kernel, (const float4 *)d_o, (const float *)d_l, out, arrive));
    };
    // the read ceiling as pkv measures it: 4 GiB streaming, best of 3 grids
    double ceiling = 0;
    for (int g = 2; g <= 8; g *= 2)
        ceiling = std::max(ceiling, stream_bytes / (queued_median_us(s, [&](int) {
                                                       stream_kernel<<<sms * g, 512, 0, s>>>((const uint4 *)buf,
                                                                                              stream_bytes / 16, sink);
                                                   }, 20) * 1e3));
    const int64_t npages = pages_per_row;
    const double bytes = 2.0 * npages * kPageBytes;
    const int64_t nvec = (int64_t)(bytes / 16), slots = (int64_t)(stream_bytes / 16) / nvec;
    printf("# dev/cuda/read_patterns.cu bound on %s (%d SMs): B1_N32768 of the paper shape, %.1f MB of K and V\n",
           prop.name, sms, bytes / 1e6);
    printf("read ceiling (4 GiB streaming, best of 3 grids, timed as a step): %.0f GB/s; 0.80 of it is %.1f us\n",
           ceiling, bytes / (0.8 * ceiling * 1e3));
    printf("| read | grid | read alone us | of ceiling | read + dependent merge us | of ceiling | merge tail us |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    auto row = [&](const char *name, int grid, auto read) {
        const double a = queued_median_us(s, [&](int r) { read(r); });
        const double b = queued_median_us(s, [&](int r) {
            read(r);
            merge(nullptr);
        });
        printf("| %s | %d | %.1f | %.3f | %.1f | %.3f | %.1f |\n", name, grid, a, bytes / (a * 1e3) / ceiling, b,
               bytes / (b * 1e3) / ceiling, b - a);
        fflush(stdout);
    };
    for (int g = 2; g <= 8; g *= 2)
        row("stream of the same bytes (contiguous)", sms * g, [&](int r) {
            stream_kernel<<<sms * g, 512, 0, s>>>((const uint4 *)buf + (r % slots) * nvec, nvec, sink);
        });
    for (int g = 2; g <= 8; g *= 2)
        row("pages: a warp per 32 KiB page (pkv's pages floor)", sms * g, [&](int r) {
            page_kernel<<<sms * g, 256, 0, s>>>(ids + (size_t)(r % rows) * pages_per_row, npages, (const uint4 *)k,
                                                (const uint4 *)v, sink);
        });
    auto head_cp_row = [&](const char *name, auto kernel, int stages) {
        const int splits = kStates, grid = kHeads * splits, smem = stages * 8192 * kWarps;
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        row(name, grid, [&](int r) {
            kernel<<<grid, 128, smem, s>>>(ids + (size_t)(r % rows) * pages_per_row, pages_per_row, splits,
                                           (const uint4 *)k, (const uint4 *)v, sink, nullptr);
        });
    };
    head_cp_row("the decode's mapping by cp.async, 2 stages (2/SM), no math", head_cp_kernel<2>, 2);
    head_cp_row("the decode's mapping by cp.async, 3 stages (2/SM), no math", head_cp_kernel<3>, 3);
    {
        // the same with the merge signalled by the splits' arrivals instead of the grid's completion: a word
        // per KV head and run (zeroed before each batch of runs, off the clock)
        const int splits = kStates, grid = kHeads * splits, smem = 2 * 8192 * kWarps, word_slots = 512;
        int *words = nullptr;
        CK(cudaMalloc(&words, (size_t)word_slots * kHeads * sizeof(int)));
        int next = 0;
        auto read = [&](int r, int *arrive) {
            head_cp_kernel<2><<<grid, 128, smem, s>>>(ids + (size_t)(r % rows) * pages_per_row, pages_per_row, splits,
                                                       (const uint4 *)k, (const uint4 *)v, sink, arrive);
        };
        auto timed = [&](bool with_merge) {
            CK(cudaMemsetAsync(words, 0, (size_t)word_slots * kHeads * sizeof(int), s));
            next = 0;
            return queued_median_us(s, [&](int r) {
                int *w = words + (size_t)(next++ % word_slots) * kHeads;
                read(r, w);
                if (with_merge) merge(w);
            });
        };
        const double a = timed(false), b = timed(true);
        printf("| the decode's mapping, 2/SM, no math; arrivals counted, merge spins on them | %d | %.1f | %.3f | %.1f | %.3f | %.1f |\n",
               grid, a, bytes / (a * 1e3) / ceiling, b, bytes / (b * 1e3) / ceiling, b - a);
        CK(cudaFree(words));
    }
    // the merge checked against the host (a wrong stand-in would time the wrong thing)
    merge(nullptr);
    CK(cudaStreamSynchronize(s));
    std::vector<__half> h_out((size_t)merges * 128);
    CK(cudaMemcpy(h_out.data(), out, h_out.size() * sizeof(__half), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int m = 0; m < merges; m++)
        for (int c = 0; c < 128; c++) {
            double mx = -1e30, tot = 0, acc = 0;
            for (int j = 0; j < kStates; j++) mx = std::max(mx, (double)h_l[m * kStates + j]);
            for (int j = 0; j < kStates; j++) {
                const double w = exp2(h_l[m * kStates + j] - mx);
                tot += w;
                acc += w * h_o[((size_t)m * kStates + j) * 128 + c];
            }
            worst = std::max(worst, fabs(acc / tot - (double)__half2float(h_out[(size_t)m * 128 + c])));
        }
    printf("merge stand-in vs float64 host: max abs err %.2e (%s)\n", worst, worst < 2e-3 ? "ok" : "WRONG");
    return worst < 2e-3 ? 0 : 1;
}

int main(int argc, char **argv) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (argc > 1 && std::string(argv[1]) == "bound") return bound_main(sms, prop);
    const probe_buffers pb;
    char *k = pb.k, *v = pb.v, *buf = pb.buf;
    uint32_t *sink = pb.sink;
    const int32_t *ids = pb.ids;
    const size_t pool_bytes = pb.pool_bytes, stream_bytes = pb.stream_bytes;
    const int pages_per_row = probe_buffers::kPagesPerRow;
    timer tm;
    printf("# dev/cuda/read_patterns.cu on %s (%d SMs), pools 2 x %.0f GiB, pages of 32 KiB (NHD, Hkv 8, d 128)\n",
           prop.name, sms, pool_bytes / 1073741824.0);
    double best_stream = 0;
    for (int g = 2; g <= 8; g *= 2) {
        const int64_t n = stream_bytes / 16;
        const double us = tm.median_us([&] { stream_kernel<<<sms * g, 512>>>((const uint4 *)buf, n, sink); });
        best_stream = std::max(best_stream, stream_bytes / (us * 1e3));
    }
    printf("read ceiling (4 GiB streaming, best of 3 grids): %.0f GB/s\n", best_stream);
    printf("| rows | MB | pattern | grid | us | GB/s | of ceiling |\n| ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
    for (int rows : {16, 1}) {
        const int64_t npages = (int64_t)rows * pages_per_row;
        const double bytes = 2.0 * npages * kPageBytes;
        auto row = [&](const char *pat, int grid, double us) {
            printf("| %d | %.1f | %s | %d | %.1f | %.0f | %.3f |\n", rows, bytes / 1e6, pat, grid, us, bytes / (us * 1e3),
                   bytes / (us * 1e3) / best_stream);
            fflush(stdout);
        };
        for (int g = 2; g <= 8; g *= 2) {
            const int64_t n = (int64_t)(bytes / 16);
            row("stream (same bytes)", sms * g,
                tm.median_us([&] { stream_kernel<<<sms * g, 512>>>((const uint4 *)buf, n, sink); }));
        }
        for (int g = 2; g <= 8; g *= 2)
            row("page (warp per 32 KiB page)", sms * g, tm.median_us([&] {
                    page_kernel<<<sms * g, 256>>>(ids, npages, (const uint4 *)k, (const uint4 *)v, sink);
                }));
        const int pairs = rows * kHeads;
        for (int per_sm : {2, 3, 4, 6}) {
            const int splits = std::max(1, sms * per_sm / pairs);
            const int grid = pairs * splits;
            char name[64];
            snprintf(name, sizeof name, "head-ldg window (%d/SM)", per_sm);
            row(name, grid, tm.median_us([&] {
                    head_ldg_kernel<1, false><<<grid, 128>>>(ids, pages_per_row, splits, (const uint4 *)k,
                                                             (const uint4 *)v, sink);
                }));
            snprintf(name, sizeof name, "head-ldg U=1 fenced (%d/SM)", per_sm);
            row(name, grid, tm.median_us([&] {
                    head_ldg_kernel<1, true><<<grid, 128>>>(ids, pages_per_row, splits, (const uint4 *)k,
                                                            (const uint4 *)v, sink);
                }));
            snprintf(name, sizeof name, "head-ldg U=2 fenced (%d/SM)", per_sm);
            row(name, grid, tm.median_us([&] {
                    head_ldg_kernel<2, true><<<grid, 128>>>(ids, pages_per_row, splits, (const uint4 *)k,
                                                            (const uint4 *)v, sink);
                }));
        }
        // the shared-memory kernels at S = 2 and 4 stages of 8 KiB per warp, where per_sm CTAs fit
        auto staged = [&](const char *pat, int per_sm, auto kernel2, auto kernel4, auto... args) {
            const int splits = std::max(1, sms * per_sm / pairs), grid = pairs * splits;
            for (int S : {2, 4}) {
                const int smem = S * 8192 * kWarps;
                if (smem * per_sm > 220 * 1024) continue;
                const auto kernel = S == 2 ? kernel2 : kernel4;
                CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                char name[64];
                snprintf(name, sizeof name, "%s S=%d (%d/SM)", pat, S, per_sm);
                row(name, grid, tm.median_us([&] { kernel<<<grid, 128, smem>>>(ids, pages_per_row, splits, args..., sink, nullptr); }));
            }
        };
        for (int per_sm : {1, 2, 3}) {
            staged("head-cp.async", per_sm, head_cp_kernel<2>, head_cp_kernel<4>, (const uint4 *)k, (const uint4 *)v);
            staged("head-bulk", per_sm, head_bulk_kernel<2>, head_bulk_kernel<4>, (const char *)k, (const char *)v);
        }
    }
    return 0;
}
