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
// A block computes MATVEC_ROWS (8) rows of w, its threads splitting the columns: in
// each pass over the rows, thread t holds float4 column t of each of the 8 rows (one 16-byte load
// a row, consecutive across the warp) and multiplies it by float4 t of x, so a pass covers
// blockDim.x float4 (the *_op helpers give up to 512 threads: a 2048-wide row in one pass, 8 x
// 16 bytes = 32 registers of weights a thread). Step 1 loads the first pass of the block's rows
// before the wait (later passes, for rows wider than 4 * blockDim.x, are loaded after it); after it, each thread reads only the 16 bytes of x it multiplies (from
// L2, no staging), a butterfly of shuffles leaves each row's sum over the warp in one lane, and one
// barrier adds up the warps. Block b computes rows 8b .. 8b + 7 (a grid of fewer than ceil(n / 8)
// blocks leaves the rows past its blocks unwritten: dealing them out grid-stride, a loop the helpers'
// launches never take, cost 3% tokens/s on an H200); rows with k % 4 != 0, or unaligned tensors,
// take a scalar loop (after the wait).
//
// Why (measured on an H200, d = 2048 x 22, fused form, benchmarks/NOTES.md pass 24): these
// kernels used a warp per row, with x staged in shared memory by every block and each warp reading
// all of x (8 KiB) from there after the wait; that staging, its barrier and the 64 KiB of shared
// memory reads a block sat on every kernel's critical path. A block of 8 rows split over its
// threads reads 8 KiB of x a block straight into registers: 85% of the read-only ceiling against
// 72% (python -m scopegraph bench: +17% tokens/s; d = 512 +16%), with 64 registers and two
// 512-thread blocks an SM (one 2048 x 2048 matrix on chip, the next kernel's first blocks beside
// it). 8 rows of two float4 a thread in 256-thread blocks spill under a cap of three blocks an SM
// (60%); 10 rows of two float4 (128 registers, two blocks an SM) reach the same 85% with more code;
// 256-thread blocks (half a row a pass, the rest loaded after the wait) give 9% fewer tokens/s, no
// register cap (95 registers: one block an SM) 17% fewer. (Rows wider than 2048 floats, which take
// more passes, were not measured.)
//
// Measured with the warp-per-row design and dropped: asking L2 for the rows of blocks that cannot
// start yet (cp.async.bulk.prefetch.L2, prefetch.global.L2), 3-21% fewer tokens/s; rows held in
// shared memory (cp.async) before the wait, 8-25% fewer; triggering the dependents only once a
// block's weights have landed, 18% fewer; x by one TMA bulk copy, 17% fewer; memory
// synchronization domains, kernel node priorities: no change; x in copies spread over more L2
// lines, or read once per thread block cluster and shared through distributed shared memory,
// 4-15% fewer.

#ifndef SG_WEIGHT_LOAD  // (benchmarks may override it)
// Weights are read once a replay and, in a model, seldom fit in L2: they are loaded evict-first
// (ld.global.cs), so that they do not push out of L2 the activations each kernel reads after its
// wait (measured on an H200, d = 2048: +2.8% tokens/s in both forms of the seed model).
#define SG_WEIGHT_LOAD __ldcs
#endif
// Rows a block, and threads a block at most: library.py's MATVEC_ROWS and MATVEC_MAX_THREADS
// (its launch check refuses larger blocks, which would overrun `partial` below).
#define MATVEC_ROWS 8
#define MATVEC_MAX_THREADS 512
// Registers capped (64) so that two blocks of 512 threads fit on an SM: one of this kernel, and one
// of the next, which meanwhile loads its weights (its pre-wait step).
#ifndef SG_MATVEC_BOUNDS  // (benchmarks may override it)
#define SG_MATVEC_BOUNDS __launch_bounds__(MATVEC_MAX_THREADS, 2)
#endif

__device__ __forceinline__ float4 zero4() { return make_float4(0.f, 0.f, 0.f, 0.f); }

// Each of acc[0..7] summed over the warp: lane l gets the sum for row l >> 2. Each step halves
// the rows a lane carries: it keeps one half, sends the other to the lane `off` away (which keeps
// that one) and adds what it receives; 9 shuffles instead of 8 warp_sums' 40.
__device__ __forceinline__ float warp_sum_rows(const float (&acc)[MATVEC_ROWS], int lane) {
    static_assert(MATVEC_ROWS == 8, "the butterfly's three halving steps take 8 rows to 1");
    float s4[4], s2[2];
    const bool b16 = lane & 16, b8 = lane & 8, b4 = lane & 4;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        s4[i] = (b16 ? acc[i + 4] : acc[i]) + __shfl_xor_sync(0xffffffffu, b16 ? acc[i] : acc[i + 4], 16);
#pragma unroll
    for (int i = 0; i < 2; ++i)
        s2[i] = (b8 ? s4[i + 2] : s4[i]) + __shfl_xor_sync(0xffffffffu, b8 ? s4[i] : s4[i + 2], 8);
    float s = (b4 ? s2[1] : s2[0]) + __shfl_xor_sync(0xffffffffu, b4 ? s2[0] : s2[1], 4);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    return s + __shfl_xor_sync(0xffffffffu, s, 1);
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<size_t>(p) & 15) == 0; }

// Float4 column c of rows row0 .. row0 + 7 of w (zeros past its end) into v: 8 loads in flight.
__device__ __forceinline__ void load_rows(float4 (&v)[MATVEC_ROWS], const float4* w4, int row0, int n, int k4, int c) {
#pragma unroll
    for (int r = 0; r < MATVEC_ROWS; ++r)
        v[r] = row0 + r < n && c < k4 ? SG_WEIGHT_LOAD(w4 + (size_t)(row0 + r) * k4 + c) : zero4();
}

// The block's rows of w (n x k) and the weights each thread loads before the wait. It holds w
// and nothing a predecessor writes: the PDL structure check (tests/test_pdl.py) reads only the
// kernels' bodies, where w is the one tensor named before pdl_wait().
struct BlockRows {
    const float* w;
    int n, k, k4, row0;  // rows row0 .. row0 + 7
    bool w_vectors;  // w read as 16-byte vectors: k % 4 == 0 and w 16-byte aligned
    float4 v[MATVEC_ROWS];

    __device__ BlockRows(const float* w_, int n_, int k_)
        : w(w_), n(n_), k(k_), k4(k_ >> 2), row0(blockIdx.x * MATVEC_ROWS), w_vectors((k_ & 3) == 0 && aligned16(w_)) {}

    // Step 1 of a PDL matvec: this thread's float4 of the first pass over each of the block's rows.
    __device__ __forceinline__ void prefetch() {
        if (w_vectors) load_rows(v, reinterpret_cast<const float4*>(w), row0, n, k4, threadIdx.x);
    }

    // Step 4: out[r] = dot(w[r, :k], x * nw) * rsqrt(mean(x^2) + eps) (NORM), out[r] += dot(w[r,
    // :k], x) (ADD), or out[r] = dot(w[r, :k], x), for the block's rows r < n. Every thread calls it.
    template <bool NORM, bool ADD>
    __device__ __forceinline__ void run(float* __restrict__ out, const float* __restrict__ x,
                                        const float* __restrict__ nw, float eps) {
        // Every tensor read as 16-byte vectors (else the scalar loop, the weights loaded in step 1 unused).
        const bool vectors = w_vectors && aligned16(x) && (!NORM || aligned16(nw));
        __shared__ float partial[MATVEC_MAX_THREADS / 32][MATVEC_ROWS + 1];  // each warp's row sums (and sum of x^2)
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        float acc[MATVEC_ROWS], ss = 0.f;
#pragma unroll
        for (int r = 0; r < MATVEC_ROWS; ++r) acc[r] = 0.f;
        if (vectors) {
            const float4* x4 = reinterpret_cast<const float4*>(x);
            const float4* n4 = reinterpret_cast<const float4*>(nw);
            for (int p = 0; p < k4; p += blockDim.x) {
                const int c = p + threadIdx.x;
                if (p) load_rows(v, reinterpret_cast<const float4*>(w), row0, n, k4, c);  // the first came before the wait
                float4 a = c < k4 ? x4[c] : zero4();
                if (NORM) {
                    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
                    const float4 g = c < k4 ? n4[c] : zero4();
                    a = make_float4(a.x * g.x, a.y * g.y, a.z * g.z, a.w * g.w);
                }
#pragma unroll
                for (int r = 0; r < MATVEC_ROWS; ++r)
                    acc[r] += v[r].x * a.x + v[r].y * a.y + v[r].z * a.z + v[r].w * a.w;
            }
        } else {
            for (int c = threadIdx.x; c < k; c += blockDim.x) {
                float a = x[c];
                if (NORM) {
                    ss += a * a;
                    a *= nw[c];
                }
#pragma unroll
                for (int r = 0; r < MATVEC_ROWS; ++r)
                    if (row0 + r < n) acc[r] += w[(size_t)(row0 + r) * k + c] * a;
            }
        }
        const float s = warp_sum_rows(acc, lane);
        if ((lane & 3) == 0) partial[warp][lane >> 2] = s;
        if (NORM) {
            ss = warp_sum(ss);
            if (lane == 0) partial[warp][MATVEC_ROWS] = ss;
        }
        __syncthreads();
        const int row = row0 + threadIdx.x;
        if (threadIdx.x < MATVEC_ROWS && row < n) {
            float dot = 0.f, sum_sq = 0.f;
            for (int i = 0; i < (int)(blockDim.x >> 5); ++i) {
                dot += partial[i][threadIdx.x];
                if (NORM) sum_sq += partial[i][MATVEC_ROWS];
            }
            if (ADD) out[row] += dot;
            else out[row] = NORM ? dot * rsqrtf(sum_sq / k + eps) : dot;
        }
    }
};

// out[r] = dot(w[r, :k], x[:k]) for r < n.
extern "C" __global__ void SG_MATVEC_BOUNDS matvec(float* __restrict__ out, const float* __restrict__ x,
                                  const float* __restrict__ w, int n, int k) {
    BlockRows rows(w, n, k);
    rows.prefetch();           // 1. weights only
    pdl_launch_dependents();   // 2.
    pdl_wait();                // 3. x is complete from here on
    rows.run<false, false>(out, x, nullptr, 0.f);
}

// out[r] += dot(w[r, :k], x[:k]) for r < n: a matvec with the residual add fused in.
extern "C" __global__ void SG_MATVEC_BOUNDS matvec_add(float* __restrict__ out, const float* __restrict__ x,
                                      const float* __restrict__ w, int n, int k) {
    BlockRows rows(w, n, k);
    rows.prefetch();
    pdl_launch_dependents();
    pdl_wait();                // out and x are predecessors' outputs
    rows.run<false, true>(out, x, nullptr, 0.f);
}

// out[r] = dot(w[r, :k], x * nw) * rsqrt(mean(x^2) + eps) for r < n: RMSNorm fused into the
// matvec that follows it (every block normalises x itself: k floats from L2, no extra kernel).
extern "C" __global__ void SG_MATVEC_BOUNDS rms_norm_matvec(float* __restrict__ out, const float* __restrict__ x,
                                           const float* __restrict__ nw, const float* __restrict__ w,
                                           float eps, int n, int k) {
    BlockRows rows(w, n, k);
    rows.prefetch();           // 1. weights only (nw is read after the wait; it is small)
    pdl_launch_dependents();
    pdl_wait();
    rows.run<true, false>(out, x, nw, eps);
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
