// scopegraph's stock kernels. Every kernel here has a numpy reference in scopegraph/library.py,
// and CI compiles each one with NVRTC for sm_90 (tests/test_compile.py).
//
// Most of them are written for programmatic dependent launch (PDL, DESIGN.md section 7) and
// declared `pdl=True` in library.py: in a graph on an sm_90+ GPU, an edge between two such
// kernels lets the dependent start while its predecessor still runs. Each PDL kernel here has the
// same four steps, which is what a kernel of yours needs to be declared pdl=True:
//
//   1. Before pdl_wait(), read nothing but the parameters named in `reads_before_wait` (weights,
//      which no predecessor writes) and write nothing: start streaming the weights now.
//   2. pdl_launch_dependents(): our own dependents may launch (they too wait before they read us).
//   3. pdl_wait(), in every thread, unconditionally: it returns once every predecessor has
//      finished and its writes are visible. (Without a programmatic edge it returns at once.)
//   4. Read the predecessors' outputs, compute, write.
//
// tests/test_pdl.py checks step 3 and the "nothing else before the wait" rule in this source, and
// on a GPU runs each kernel behind a predecessor that writes its inputs late.

// -- PDL building blocks ---------------------------------------------------------------------

#ifndef SG_LATE_TRIGGER  // 1: trigger dependents after the wait instead of before it (benchmarks)
#define SG_LATE_TRIGGER 0
#endif
// Blocks until every predecessor grid of a programmatic edge has finished and its memory
// operations are visible (griddepcontrol.wait, i.e. cudaGridDependencySynchronize()).
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#if SG_LATE_TRIGGER
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#endif
}

// Lets the kernels that depend on this one programmatically launch once every block of this grid
// has called it (or exited): griddepcontrol.launch_dependents, i.e. cudaTriggerProgrammaticLaunchCompletion().
__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900 && !SG_LATE_TRIGGER
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// The sum of v over the block (every thread gets it). Every thread of the block must call it.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    v = warp_sum(v);
    __syncthreads();  // `partial` may still be read by a previous call
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x + 31) / 32 ? partial[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) total = v;
    }
    __syncthreads();
    return total;
}

// -- elementwise: one thread per element -------------------------------------------------------

extern "C" __global__ void fill(float* __restrict__ out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    pdl_launch_dependents();
    pdl_wait();  // an earlier kernel may still read or write `out`
    if (i < n) out[i] = value;
}

extern "C" __global__ void add(float* __restrict__ out, const float* __restrict__ a,
                               const float* __restrict__ b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    pdl_launch_dependents();
    pdl_wait();  // a and b are predecessors' outputs
    if (i < n) out[i] = a[i] + b[i];
}

// out += a * x
extern "C" __global__ void axpy(float* __restrict__ out, const float* __restrict__ x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    pdl_launch_dependents();
    pdl_wait();
    if (i < n) out[i] += a * x[i];
}

// out += value: the "tiny kernel" of the launch-overhead benchmarks.
extern "C" __global__ void add_scalar(float* __restrict__ out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    pdl_launch_dependents();
    pdl_wait();
    if (i < n) out[i] += value;
}

// Does nothing: measures the cost of a node itself. Not a PDL kernel (it never waits).
extern "C" __global__ void noop() {}

// -- RMSNorm ---------------------------------------------------------------------------------

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w. One block of BS threads per row.
template <int BS>
__global__ void rms_norm(float* __restrict__ out, const float* __restrict__ x,
                         const float* __restrict__ w, float eps, int d) {
    static_assert(BS % 32 == 0 && BS <= 1024, "BS must be a multiple of 32, at most 1024");
    constexpr int EARLY = 8;  // elements per thread held in registers (the rest, if d > EARLY * BS, is looped)
    // 1. The weights (frozen: no predecessor writes them) into registers.
    float we[EARLY];
#pragma unroll
    for (int u = 0; u < EARLY; ++u) {
        int i = threadIdx.x + u * BS;
        we[u] = i < d ? w[i] : 0.f;
    }
    pdl_launch_dependents();  // 2.
    pdl_wait();               // 3. x is complete from here on
    const float* row = x + (size_t)blockIdx.x * d;
    float* dst = out + (size_t)blockIdx.x * d;
    float xe[EARLY], sum = 0.f;  // 4. the row, read once
#pragma unroll
    for (int u = 0; u < EARLY; ++u) {
        int i = threadIdx.x + u * BS;
        xe[u] = i < d ? row[i] : 0.f;
        sum += xe[u] * xe[u];
    }
    for (int i = threadIdx.x + EARLY * BS; i < d; i += BS) sum += row[i] * row[i];
    const float scale = rsqrtf(block_sum(sum) / d + eps);
#pragma unroll
    for (int u = 0; u < EARLY; ++u) {
        int i = threadIdx.x + u * BS;
        if (i < d) dst[i] = xe[u] * scale * we[u];
    }
    for (int i = threadIdx.x + EARLY * BS; i < d; i += BS) dst[i] = row[i] * scale * w[i];
}

// -- matrix-vector products: the weight-streaming kernels of the seed model --------------------
//
// A warp per row; rows are dealt out grid-stride (row = blockIdx.x * warps + warp, then
// + gridDim.x * warps), so the grid sets the rows per warp. The *_op helpers give each warp one
// row (8 rows per 256-thread block): at d = 2048 every warp then holds its whole row in registers
// before the wait, i.e. the whole 16 MiB matrix is requested at once (measured on an H100: 2 rows
// a warp, 18% fewer tokens/s; 4 rows, 39% fewer). Each lane reads the row as 16-byte vectors,
// CHUNK of them in flight at once (CHUNK = 16: a 2048-wide row in one round trip to memory; the
// *_op helpers launch a second build, with CHUNK = 4, for rows of at most 512 floats: fewer
// instructions, at d = 512 about 25% more tokens/s). The vector x is staged in shared memory once
// per block when the launch gives k * 4 bytes of it (the *_op helpers do, up to 48 KiB), so x is
// read from L2 once per block rather than once per row; other shapes (k % 4 != 0, unaligned rows,
// no shared memory) take a plain scalar loop. Where x is copied as is, cp.async stages it: every
// load in flight at once and no registers spent (the weights hold them), one L2 round trip after
// the wait instead of one per 256 floats a thread (measured on an H100, d = 2048: 4-kernel form
// +0.9% tokens/s).
//
// Measured on an H100 and dropped (benchmarks/NOTES.md): asking L2 (cp.async.bulk.prefetch.L2,
// prefetch.global.L2) for the rows of the blocks that cannot start yet, 6-17% fewer tokens/s; and
// half of each row held in shared memory (cp.async) so that four blocks fit an SM, 8-15% fewer.
// On an H200: triggering the dependents only once this block's weights have landed (so that the
// next kernel's weights do not share the memory with this kernel's last blocks), 18% fewer; x
// staged by one TMA bulk copy instead of cp.async, 17% fewer; rms_norm_matvec staging x and the
// norm's weights by cp.async into 2 k floats of shared memory (one round trip, not two), 12% fewer;
// a second row a warp copied into shared memory before the wait (every row of a matvec requested
// early, half the grid), 20-25% fewer: x, read after the wait, queues behind every weight request
// made before it, and more of them made early lengthens each kernel's critical path; each matvec
// asking L2 for a later matvec's rows before its wait (cp.async.bulk.prefetch.L2, one to three
// kernels ahead), 3-21% fewer: L2 drops some before they are read, and they are fetched twice;
// blocks of 2, 4 or 6 warps (the same threads an SM), 5-20% fewer, and 12 warps the same as 8;
// rms_norm_matvec copying the norm's weights into shared memory before its wait, 10% fewer.

#ifndef CHUNK  // float4 loads in flight per lane (benchmarks may override it)
#define CHUNK 16
#endif
// Weights are read once a replay and, in a model, seldom fit in L2: the wide build loads them
// evict-first (ld.global.cs), so that they do not push out of L2 the activations each kernel reads
// after its wait (measured on an H200, d = 2048: +2.8% tokens/s in both forms of the seed model;
// on an H100, with an earlier version of these kernels, within 0.5%). The narrow build (CHUNK = 4,
// rows of at most 512 floats, whose matrices often stay in L2 from one replay to the next) loads
// them as read-only data (__ldg), which L2 keeps.
#ifndef SG_WEIGHT_LOAD  // (benchmarks may override it)
#if CHUNK > 4
#define SG_WEIGHT_LOAD __ldcs
#else
#define SG_WEIGHT_LOAD __ldg
#endif
#endif
// At most 256 threads a block, and registers capped (80) so that three blocks fit on an SM: two
// of this kernel, and one of the next, which meanwhile loads its weights (its pre-wait step).
// Measured on an H100 (d = 2048): 1.31x from PDL with the cap, 1.17x without it.
#ifndef SG_MATVEC_BOUNDS  // (benchmarks may override it)
#define SG_MATVEC_BOUNDS __launch_bounds__(256, 3)
#endif

extern __shared__ float4 sg_dynamic_smem[];

__device__ __forceinline__ unsigned dynamic_smem_bytes() {
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

// The rows of w (n x k) that this warp computes, and the weights it loads before the wait.
struct WarpRows {
    const float* w;
    int n, k, k4, lane, first, stride;
    bool vec;  // 16-byte vectors: k % 4 == 0 and w 16-byte aligned (x is staged in shared memory)

    __device__ WarpRows(const float* w_, int n_, int k_) : w(w_), n(n_), k(k_) {
        const int warps = blockDim.x >> 5;
        lane = threadIdx.x & 31;
        first = blockIdx.x * warps + (threadIdx.x >> 5);
        stride = gridDim.x * warps;
        k4 = k >> 2;
        vec = (k & 3) == 0 && (reinterpret_cast<size_t>(w) & 15) == 0 && dynamic_smem_bytes() >= 4u * k;
    }

    // Weights [c0, c0 + 32 * CHUNK) of `row`, this lane's share, into registers (zeros past the end
    // of the row): CHUNK loads issued back to back, one round trip to memory.
    __device__ __forceinline__ void load(float4 (&v)[CHUNK], int row, int c0) const {
        const float4* r = reinterpret_cast<const float4*>(w + (size_t)row * k) + c0 + lane;
#pragma unroll
        for (int u = 0; u < CHUNK; ++u)
            v[u] = c0 + lane + 32 * u < k4 ? SG_WEIGHT_LOAD(r + 32 * u) : make_float4(0.f, 0.f, 0.f, 0.f);
    }

    // dot(v, x[c0, c0 + 32 * CHUNK)), this lane's share.
    __device__ __forceinline__ float dot(const float4 (&v)[CHUNK], const float4* xs, int c0) const {
        float acc = 0.f;
#pragma unroll
        for (int u = 0; u < CHUNK; ++u) {
            const int c = c0 + lane + 32 * u;
            if (c < k4) {
                const float4 a = xs[c];
                acc += v[u].x * a.x + v[u].y * a.y + v[u].z * a.z + v[u].w * a.w;
            }
        }
        return acc;
    }

    // Step 1 of a PDL matvec: the first chunk of this warp's first row, into registers. Weights only.
    __device__ __forceinline__ void prefetch(float4 (&v)[CHUNK]) const {
        if (vec && first < n) load(v, first, 0);
    }

    // Step 4: dot(w[row, :], x) for each of this warp's rows, handed to done(row, dot) in lane 0.
    // xs: x (k floats) in shared memory, as float4 (vector path); x: x in global memory (scalar path).
    template <class Done>
    __device__ __forceinline__ void run(float4 (&v)[CHUNK], const float4* xs, const float* x, const float* scale_x,
                                        Done done) const {
        for (int row = first; row < n; row += stride) {
            float acc = 0.f;
            if (vec) {
                for (int c0 = 0; c0 < k4; c0 += 32 * CHUNK) {
                    if (row != first || c0 != 0) load(v, row, c0);  // the first chunk came before the wait
                    acc += dot(v, xs, c0);
                }
            } else {
                const float* r = w + (size_t)row * k;
                for (int c = lane; c < k; c += 32) acc += r[c] * x[c] * (scale_x ? scale_x[c] : 1.f);
            }
            acc = warp_sum(acc);
            if (lane == 0) done(row, acc);
        }
    }
};

#ifndef SG_STAGE_ASYNC  // 0: stage x by loads and stores only (benchmarks)
#define SG_STAGE_ASYNC 1
#endif

// Stage x (times nw, if given) in shared memory as float4 when the vector path applies; returns
// the sum of x^2 over the block when sum_sq is set. Every thread of the block must call it.
__device__ const float4* stage_vector(WarpRows& rows, const float* x, const float* nw, bool sum_sq, float* ss) {
    float local = 0.f;
    if (rows.vec && (reinterpret_cast<size_t>(x) & 15) == 0 && (!nw || (reinterpret_cast<size_t>(nw) & 15) == 0)) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* n4 = reinterpret_cast<const float4*>(nw);
        for (int c = threadIdx.x; c < rows.k4; c += blockDim.x) {
#if __CUDA_ARCH__ >= 800 && SG_STAGE_ASYNC
            if (!nw && !sum_sq) {
                const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(sg_dynamic_smem + c));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(x4 + c) : "memory");
                continue;
            }
#endif
            float4 a = x4[c];
            local += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            if (n4) {
                float4 g = n4[c];
                a = make_float4(a.x * g.x, a.y * g.y, a.z * g.z, a.w * g.w);
            }
            sg_dynamic_smem[c] = a;
        }
#if __CUDA_ARCH__ >= 800 && SG_STAGE_ASYNC
        asm volatile("cp.async.wait_all;" ::: "memory");
#endif
    } else {
        for (int c = threadIdx.x; c < rows.k; c += blockDim.x) local += x[c] * x[c];
        rows.vec = false;
    }
    if (sum_sq) *ss = block_sum(local);  // its barriers also publish the staged vector
    else __syncthreads();
    return sg_dynamic_smem;
}

// out[r] = dot(w[r, :k], x[:k]) for r < n.
extern "C" __global__ void SG_MATVEC_BOUNDS matvec(float* __restrict__ out, const float* __restrict__ x,
                                  const float* __restrict__ w, int n, int k) {
    WarpRows rows(w, n, k);
    float4 v[CHUNK];
    rows.prefetch(v);          // 1. weights only
    pdl_launch_dependents();   // 2.
    pdl_wait();                // 3. x is complete from here on
    const float4* xs = stage_vector(rows, x, nullptr, false, nullptr);
    rows.run(v, xs, x, nullptr, [&](int row, float dot) { out[row] = dot; });
}

// out[r] += dot(w[r, :k], x[:k]) for r < n: a matvec with the residual add fused in.
extern "C" __global__ void SG_MATVEC_BOUNDS matvec_add(float* __restrict__ out, const float* __restrict__ x,
                                      const float* __restrict__ w, int n, int k) {
    WarpRows rows(w, n, k);
    float4 v[CHUNK];
    rows.prefetch(v);
    pdl_launch_dependents();
    pdl_wait();
    const float4* xs = stage_vector(rows, x, nullptr, false, nullptr);
    rows.run(v, xs, x, nullptr, [&](int row, float dot) { out[row] += dot; });
}

// out[r] = dot(w[r, :k], x * nw) * rsqrt(mean(x^2) + eps) for r < n: RMSNorm fused into the
// matvec that follows it (every block normalises x itself: k floats from L2, no extra kernel).
extern "C" __global__ void SG_MATVEC_BOUNDS rms_norm_matvec(float* __restrict__ out, const float* __restrict__ x,
                                           const float* __restrict__ nw, const float* __restrict__ w,
                                           float eps, int n, int k) {
    WarpRows rows(w, n, k);
    float4 v[CHUNK];
    rows.prefetch(v);          // 1. weights only (nw is read after the wait; it is small)
    pdl_launch_dependents();
    pdl_wait();
    float ss = 0.f;
    const float4* xs = stage_vector(rows, x, nw, true, &ss);
    const float scale = rsqrtf(ss / k + eps);
    rows.run(v, xs, x, nw, [&](int row, float dot) { out[row] = dot * scale; });
}

// flag[0] -= 1, by one thread: the counter of a loop `with s.while_(flag)` that runs flag times.
extern "C" __global__ void count_down(int* __restrict__ flag) {
    if (blockIdx.x == 0 && threadIdx.x == 0) flag[0] -= 1;
}

// A decode loop's "emit this token": out[row, :d] = x[:d] for row = *position (if row < limit),
// then *position = row + 1 and *flag = (row + 1 < limit). Block 0 does the work: it reads the
// position before any thread moves it on.
extern "C" __global__ void append_row(float* __restrict__ out, int* __restrict__ position, int* __restrict__ flag,
                                      const float* __restrict__ x, int d, int limit) {
    if (blockIdx.x != 0) return;
    __shared__ int row;
    if (threadIdx.x == 0) row = *position;
    __syncthreads();
    if (row >= 0 && row < limit)
        for (int i = threadIdx.x; i < d; i += blockDim.x) out[(size_t)row * d + i] = x[i];
    if (threadIdx.x == 0) {
        *position = row + 1;
        *flag = row + 1 < limit;
    }
}
