// scopegraph's stock kernels. Every kernel here has a numpy reference in scopegraph/library.py,
// and CI compiles each one with NVRTC for sm_90 (tests/test_compile.py).

// One thread per element.
extern "C" __global__ void fill(float* __restrict__ out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}

extern "C" __global__ void add(float* __restrict__ out, const float* __restrict__ a,
                               const float* __restrict__ b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// out += a * x
extern "C" __global__ void axpy(float* __restrict__ out, const float* __restrict__ x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += a * x[i];
}

// out += value: the "tiny kernel" of the launch-overhead benchmarks.
extern "C" __global__ void add_scalar(float* __restrict__ out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += value;
}

// Does nothing: measures the cost of a node itself.
extern "C" __global__ void noop() {}

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w. One block of BS threads per row.
template <int BS>
__global__ void rms_norm(float* __restrict__ out, const float* __restrict__ x,
                         const float* __restrict__ w, float eps, int d) {
    static_assert(BS % 32 == 0 && BS <= 1024, "BS must be a multiple of 32, at most 1024");
    __shared__ float partial[BS / 32];
    __shared__ float scale;
    const float* row = x + (size_t)blockIdx.x * d;
    float* dst = out + (size_t)blockIdx.x * d;
    float sum = 0.f;
    for (int i = threadIdx.x; i < d; i += BS) sum += row[i] * row[i];
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < BS / 32 ? partial[threadIdx.x] : 0.f;
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
        if (threadIdx.x == 0) scale = rsqrtf(sum / d + eps);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += BS) dst[i] = row[i] * scale * w[i];
}

// out[r] = dot(w[r, :], x) for r < n. One warp per row; each lane issues 16 16-byte loads before
// using any, so a 2048-wide row is one round trip to memory and the weights stream at close to
// the memory bandwidth. Needs k % 4 == 0 and
// 16-byte-aligned rows for the vector path; other shapes take the scalar loop.
extern "C" __global__ void matvec(float* __restrict__ out, const float* __restrict__ x,
                                  const float* __restrict__ w, int n, int k) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    const float* wr = w + (size_t)row * k;
    float acc = 0.f;
    const bool vec = (k & 3) == 0 && ((reinterpret_cast<size_t>(w) | reinterpret_cast<size_t>(x)) & 15) == 0;
    if (vec) {
        const float4* w4 = reinterpret_cast<const float4*>(wr);
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const int k4 = k >> 2;
        int c = lane;
        for (; c + 15 * 32 < k4; c += 16 * 32) {
            float4 wv[16];
#pragma unroll
            for (int u = 0; u < 16; ++u) wv[u] = __ldcs(w4 + c + u * 32);
#pragma unroll
            for (int u = 0; u < 16; ++u) {
                float4 xv = __ldg(x4 + c + u * 32);
                acc += wv[u].x * xv.x + wv[u].y * xv.y + wv[u].z * xv.z + wv[u].w * xv.w;
            }
        }
        for (; c < k4; c += 32) {
            float4 wv = __ldcs(w4 + c), xv = __ldg(x4 + c);
            acc += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
        }
    } else {
        for (int c = lane; c < k; c += 32) acc += wr[c] * x[c];
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) out[row] = acc;
}
