// Decode floor lab: standalone measurements behind the single-token kernel choices and the
// per-kernel floor quoted in docs/cuda-backend.md. Not part of the build (no project code, no
// dependencies): compile by hand and run on the GPU host.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o decode_floor_lab bench/lab/decode_floor_lab.cu
//   ./decode_floor_lab gemv       # GEMV shapes back to back, and the 61-GEMV decode chain in a graph
//   ./decode_floor_lab moe        # single-token expert kernels (6 routed + shared), variants
//   ./decode_floor_lab prefetch   # L2 prefetch of the next weights from a side stream
//   ./decode_floor_lab overlap    # PDL GEMVs: L2 bulk prefetch before the wait, split-K warps
//   ./decode_floor_lab bulk       # GEMVs streaming weights with bulk copies (TMA) into shared
//                                 # memory, checked against the 16-byte-load kernel (not yet run
//                                 # on the H200: written when the 2026-11-30 device time was spent)
//
// Results of 2026-11-30: bench/results/h200-2026-11-30b/{gemv_lab,moe_lab,l2_prefetch_lab}.log.
// Weights are filled with a constant (the kernels' speed does not depend on the values); every
// figure is wall time per call or per graph replay from CUDA events.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

void Check(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s (line %d): %s\n", what, line, cudaGetErrorString(e));
  std::exit(1);
}
#define LAB_CHECK(x) Check((x), #x, __LINE__)

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint4 LoadWeights(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t Pack(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// acc + 8 bf16 weights · 8 activations (rounded to bf16), as the production kernel computes it.
__device__ __forceinline__ float Dot8(uint4 w, const float* x, float acc) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(x));
  const float4 b = __ldg(reinterpret_cast<const float4*>(x + 4));
  const uint32_t xs[4] = {Pack(a.x, a.y), Pack(a.z, a.w), Pack(b.x, b.y), Pack(b.z, b.w)};
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(ws[i] << 16), __uint_as_float(xs[i] << 16), acc);
    acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), __uint_as_float(xs[i] & 0xffff0000u), acc);
  }
  return acc;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- one kernel shape for every variant: R rows per warp (row r of group g is w[g * R + r] or,
// with kPairs, gate row g and up row g + rows / 2), U 256-wide chunks per pass, T threads.
// kPdl: lets dependents launch at once and issues the first weight loads before the wait.
template <int R, int U, int T, bool kPdl>
__global__ void __launch_bounds__(T) RowsKernel(const float* x, const bf16* w, int64_t k,
                                                int64_t rows, float* y) {
  if (kPdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int lane = threadIdx.x & 31;
  const int64_t first = (int64_t{blockIdx.x} * (T / 32) + (threadIdx.x >> 5)) * R;
  bool waited = !kPdl;
  float acc[R] = {};
  uint4 v[R][U];
  if (first < rows) {
    for (int64_t base = 0; base < k; base += U * 256) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t kk = base + u * 256 + lane * 8;
          v[r][u] = first + r < rows && kk < k ? LoadWeights(w + (first + r) * k + kk)
                                                : make_uint4(0, 0, 0, 0);
        }
      }
      if (!waited) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        waited = true;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t kk = base + u * 256 + lane * 8;
          if (first + r < rows && kk < k) acc[r] = Dot8(v[r][u], x + kk, acc[r]);
        }
      }
    }
  }
  if (!waited) asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = WarpSum(acc[r]);
    if (lane == r && first + r < rows) y[first + r] = s;
  }
}

// A small dependent op between GEMVs (like a norm): 4096 floats, one block.
__global__ void TinyKernel(const float* a, float* b) {
  for (int i = threadIdx.x; i < 4096; i += blockDim.x) b[i] = a[i] * 0.5f + 1.0f;
}

using RowsFn = void (*)(const float*, const bf16*, int64_t, int64_t, float*);
struct Variant {
  const char* name;
  RowsFn plain, pdl;
  int rows_per_warp, threads;
};
template <int R, int U, int T>
Variant MakeVariant(const char* name) {
  return Variant{name, RowsKernel<R, U, T, false>, RowsKernel<R, U, T, true>, R, T};
}

// Launches `fn` on `s` over `blocks` blocks of `threads`, with programmatic dependent launch when
// `pdl` (every lab launch goes through here).
template <class... Kernel, class... Args>
void Launch(void (*fn)(Kernel...), int64_t blocks, int threads, bool pdl, cudaStream_t s,
            Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(threads);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  LAB_CHECK(cudaLaunchKernelEx(&cfg, fn, args...));
}

void LaunchRows(const Variant& v, bool pdl, cudaStream_t s, const float* x, const bf16* w,
                int64_t k, int64_t rows, float* y) {
  const int64_t per_block = int64_t{v.threads / 32} * v.rows_per_warp;
  Launch(pdl ? v.pdl : v.plain, (rows + per_block - 1) / per_block, v.threads, pdl, s, x, w, k,
         rows, y);
}

// Microseconds per call of `issue` (3 warm-up calls, then `iters` timed ones).
template <class F>
double Micros(cudaStream_t s, int iters, F issue) {
  cudaEvent_t e0, e1;
  LAB_CHECK(cudaEventCreate(&e0));
  LAB_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) issue();
  LAB_CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < iters; ++i) issue();
  LAB_CHECK(cudaEventRecord(e1, s));
  LAB_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  LAB_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  LAB_CHECK(cudaEventDestroy(e0));
  LAB_CHECK(cudaEventDestroy(e1));
  return ms * 1000.0 / iters;
}

// Instantiates and times a graph captured from `record` on `s`.
template <class F>
double GraphMicros(cudaStream_t s, int iters, F record) {
  cudaGraph_t g;
  cudaGraphExec_t exec;
  LAB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  record();
  LAB_CHECK(cudaStreamEndCapture(s, &g));
  LAB_CHECK(cudaGraphInstantiate(&exec, g, 0));
  const double us = Micros(s, iters, [&] { LAB_CHECK(cudaGraphLaunch(exec, s)); });
  LAB_CHECK(cudaGraphExecDestroy(exec));
  LAB_CHECK(cudaGraphDestroy(g));
  return us;
}

struct Shape {
  const char* name;
  int64_t n, k;
};

template <class T>
T* DeviceFill(size_t count, int byte) {
  T* p = nullptr;
  LAB_CHECK(cudaMalloc(&p, count * sizeof(T)));
  LAB_CHECK(cudaMemset(p, byte, count * sizeof(T)));
  return p;
}

// A per-shape table: `title` (ending in a newline), then the header row ("variant" in a column
// `width` wide, then the shapes' names).
void TableHeader(const char* title, int width, const std::vector<Shape>& shapes) {
  std::printf("%s%-*s", title, width, "variant");
  for (const Shape& sh : shapes) std::printf(" %16s", sh.name);
  std::printf("\n");
}

// One row of such a table: `name`, then per shape us(shape) microseconds per call and GB/s.
template <class F>
void Row(const char* name, int width, const std::vector<Shape>& shapes, F us) {
  std::printf("%-*s", width, name);
  for (const Shape& sh : shapes) {
    const double t = us(sh);
    std::printf(" %7.1f (%6.0f)", t, sh.n * sh.k * 2 / t / 1e3);
  }
  std::printf("\n");
}

// A row timed back to back: launch(shape) 30 times per shape.
template <class F>
void TimeRow(cudaStream_t s, const char* name, const std::vector<Shape>& shapes, F launch) {
  Row(name, 14, shapes,
      [&](const Shape& sh) { return Micros(s, 30, [&] { launch(sh); }); });
}

// The weights a batch-1 step streams, as GEMV shapes in order: per layer the attention
// projections, the router, the shared expert and 6 routed experts; 3 layers, then lm_head.
std::vector<Shape> DecodeChain() {
  std::vector<Shape> layer = {{"q_a", 1024, 4096},  {"q_b", 32768, 1024},   {"kv", 512, 4096},
                              {"o_a", 8192, 4096},  {"o_b", 4096, 8192},    {"router", 256, 4096},
                              {"sh_gu", 4096, 4096}, {"sh_dn", 4096, 2048}};
  for (int e = 0; e < 6; ++e) {
    layer.push_back({"ex_gu", 4096, 4096});
    layer.push_back({"ex_dn", 4096, 2048});
  }
  std::vector<Shape> chain;
  for (int l = 0; l < 3; ++l) chain.insert(chain.end(), layer.begin(), layer.end());
  chain.push_back({"lm_head", 129280, 4096});
  return chain;
}

int Gemv(cudaStream_t s) {
  const std::vector<Shape> chain = DecodeChain();
  size_t total = 0;
  for (const Shape& c : chain) total += c.n * c.k;
  bf16* pool = DeviceFill<bf16>(total, 0x3c);
  float* x = DeviceFill<float>(1 << 18, 0);
  float* y = DeviceFill<float>(129280, 0);
  const std::vector<Variant> variants = {
      MakeVariant<1, 16, 256>("R1 U16 T256"), MakeVariant<2, 8, 256>("R2 U8 T256"),
      MakeVariant<4, 4, 256>("R4 U4 T256"),   MakeVariant<1, 8, 256>("R1 U8 T256"),
      MakeVariant<1, 8, 128>("R1 U8 T128"),   MakeVariant<2, 4, 128>("R2 U4 T128"),
      MakeVariant<1, 4, 128>("R1 U4 T128"),   MakeVariant<1, 16, 128>("R1 U16 T128"),
      MakeVariant<1, 32, 256>("R1 U32 T256")};
  const std::vector<Shape> singles = {{"q_a", 1024, 4096},   {"q_b", 32768, 1024},
                                      {"kv", 512, 4096},     {"o_b", 4096, 8192},
                                      {"o_a", 8192, 4096},   {"sh_gu", 4096, 4096},
                                      {"sh_dn", 4096, 2048}, {"lm_head", 129280, 4096}};
  TableHeader("back to back, us per call (GB/s); R rows per warp, U loads per lane per pass, "
              "T threads\n",
              14, singles);
  for (const Variant& v : variants) {
    TimeRow(s, v.name, singles,
            [&](const Shape& sh) { LaunchRows(v, false, s, x, pool, sh.k, sh.n, y); });
  }
  std::printf("\ngraph of the decode chain: %zu GEMVs (3 layers + lm_head), %.1f MB, roofline "
              "%.1f us at 4.8 TB/s; tiny=1 puts a small dependent kernel before each GEMV\n",
              chain.size(), total * 2 / 1e6, total * 2 / 4.8e6);
  for (int pdl = 0; pdl < 2; ++pdl) {
    for (const Variant& v : variants) {
      for (int tiny = 0; tiny < 2; ++tiny) {
        const double us = GraphMicros(s, 20, [&] {
          size_t off = 0;
          for (const Shape& c : chain) {
            if (tiny) TinyKernel<<<1, 256, 0, s>>>(y, x);
            LaunchRows(v, pdl, s, x, pool + off, c.k, c.n, y);
            off += c.n * c.k;
          }
        });
        std::printf("%-14s pdl=%d tiny=%d %8.1f us/step %6.0f GB/s\n", v.name, pdl, tiny, us,
                    total * 2 / us / 1e3);
      }
    }
  }
  return 0;
}

// ---- experts at one token: 7 slots (6 routed + shared) stored back to back, D 4096, I 2048 ----
constexpr int64_t kD = 4096, kI = 2048, kSlots = 7;

// Group g: with R == 2 the gate and up rows of column g (shared x, SwiGLU written to h[g]);
// with R == 1 row g of the stacked [slots * 2I, D] weights (the dot product written to h[g]).
template <int R, int U, int T>
__global__ void __launch_bounds__(T) GateUpKernel(const float* u, const bf16* gu, float* h) {
  const int lane = threadIdx.x & 31;
  const int64_t g = int64_t{blockIdx.x} * (T / 32) + (threadIdx.x >> 5);
  const int64_t groups = R == 2 ? kSlots * kI : kSlots * 2 * kI;
  if (g >= groups) return;
  const bf16* w[R];
  if (R == 2) {
    const int64_t s = g / kI, c = g % kI;
    w[0] = gu + (s * 2 * kI + c) * kD;
    w[R - 1] = gu + (s * 2 * kI + kI + c) * kD;
  } else {
    w[0] = gu + g * kD;
  }
  float acc[R] = {};
  uint4 v[R][U];
  for (int64_t base = 0; base < kD; base += U * 256) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int q = 0; q < U; ++q) v[r][q] = LoadWeights(w[r] + base + q * 256 + lane * 8);
    }
#pragma unroll
    for (int q = 0; q < U; ++q) {
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = Dot8(v[r][q], u + base + q * 256 + lane * 8, acc[r]);
    }
  }
  const float a0 = WarpSum(acc[0]);
  if (R == 2) {
    const float a1 = WarpSum(acc[R - 1]);
    if (lane == 0) {
      const float gate = fminf(a0, 10.0f), up = fminf(fmaxf(a1, -10.0f), 10.0f);
      h[g] = gate / (1.0f + expf(-gate)) * up;
    }
  } else if (lane == 0) {
    h[g] = a0;
  }
}

// kAllSlots: warp d sums every slot of output row d (weighted); else group (s, d) writes the
// per-slot partial (a combine launch would follow).
template <bool kAllSlots, int U, int T>
__global__ void __launch_bounds__(T) DownKernel(const float* h, const bf16* dn, const float* wt,
                                                float* out) {
  const int lane = threadIdx.x & 31;
  const int64_t g = int64_t{blockIdx.x} * (T / 32) + (threadIdx.x >> 5);
  if (kAllSlots) {
    if (g >= kD) return;
    float acc[8] = {};
    uint4 v[8][U];
    for (int64_t base = 0; base < kI; base += U * 256) {
#pragma unroll
      for (int r = 0; r < 8; ++r) {
#pragma unroll
        for (int q = 0; q < U; ++q) {
          v[r][q] = r < kSlots ? LoadWeights(dn + (r * kD + g) * kI + base + q * 256 + lane * 8)
                               : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int r = 0; r < 8; ++r) {
#pragma unroll
        for (int q = 0; q < U; ++q) {
          if (r < kSlots) acc[r] = Dot8(v[r][q], h + r * kI + base + q * 256 + lane * 8, acc[r]);
        }
      }
    }
    float sum = 0;
#pragma unroll
    for (int r = 0; r < kSlots; ++r) sum += wt[r] * WarpSum(acc[r]);
    if (lane == 0) out[g] = sum;
  } else {
    if (g >= kD * kSlots) return;
    const int64_t s = g / kD, d = g % kD;
    float acc = 0;
    uint4 v[U];
    for (int64_t base = 0; base < kI; base += U * 256) {
#pragma unroll
      for (int q = 0; q < U; ++q) v[q] = LoadWeights(dn + (s * kD + d) * kI + base + q * 256 + lane * 8);
#pragma unroll
      for (int q = 0; q < U; ++q) acc = Dot8(v[q], h + s * kI + base + q * 256 + lane * 8, acc);
    }
    acc = WarpSum(acc);
    if (lane == 0) out[kD + s * kD + d] = acc;
  }
}

int Moe(cudaStream_t s) {
  bf16* gu = DeviceFill<bf16>(kSlots * 2 * kI * kD, 0x3c);
  bf16* dn = DeviceFill<bf16>(kSlots * kD * kI, 0x3c);
  float* u = DeviceFill<float>(kD, 0);
  float* h = DeviceFill<float>(kSlots * 2 * kI, 0);
  float* out = DeviceFill<float>((kSlots + 1) * kD, 0);
  float* wt = DeviceFill<float>(16, 0);
  const double gu_bytes = 2.0 * kSlots * 2 * kI * kD, dn_bytes = 2.0 * kSlots * kD * kI;
  auto gate_up = [&](const char* name, auto kernel, int rows_per_warp, int threads) {
    const int64_t groups = rows_per_warp == 2 ? kSlots * kI : kSlots * 2 * kI;
    const unsigned blocks = static_cast<unsigned>((groups + threads / 32 - 1) / (threads / 32));
    const double us = Micros(s, 30, [&] { kernel<<<blocks, threads, 0, s>>>(u, gu, h); });
    std::printf("gate_up %-14s %7.1f us %6.0f GB/s\n", name, us, gu_bytes / us / 1e3);
  };
  auto down = [&](const char* name, auto kernel, bool all_slots, int threads) {
    const int64_t groups = all_slots ? kD : kD * kSlots;
    const unsigned blocks = static_cast<unsigned>((groups + threads / 32 - 1) / (threads / 32));
    const double us = Micros(s, 30, [&] { kernel<<<blocks, threads, 0, s>>>(h, dn, wt, out); });
    std::printf("down    %-14s %7.1f us %6.0f GB/s\n", name, us, dn_bytes / us / 1e3);
  };
  gate_up("R2 U2 T128", GateUpKernel<2, 2, 128>, 2, 128);
  gate_up("R2 U4 T128", GateUpKernel<2, 4, 128>, 2, 128);
  gate_up("R2 U1 T128", GateUpKernel<2, 1, 128>, 2, 128);
  gate_up("R1 U4 T128", GateUpKernel<1, 4, 128>, 1, 128);
  gate_up("R1 U8 T128", GateUpKernel<1, 8, 128>, 1, 128);
  gate_up("R1 U2 T128", GateUpKernel<1, 2, 128>, 1, 128);
  gate_up("R2 U2 T256", GateUpKernel<2, 2, 256>, 2, 256);
  gate_up("R1 U4 T256", GateUpKernel<1, 4, 256>, 1, 256);
  down("all-slots U1 T128", DownKernel<true, 1, 128>, true, 128);
  down("all-slots U1 T64", DownKernel<true, 1, 64>, true, 64);
  down("all-slots U1 T256", DownKernel<true, 1, 256>, true, 256);
  down("per-slot U4 T128", DownKernel<false, 4, 128>, false, 128);
  down("per-slot U8 T128", DownKernel<false, 8, 128>, false, 128);
  down("per-slot U2 T128", DownKernel<false, 2, 128>, false, 128);
  down("per-slot U4 T64", DownKernel<false, 4, 64>, false, 64);
  return 0;
}

// ---- L2 prefetch of the next GEMV's weights during small kernels ----
__global__ void PrefetchBulkKernel(const char* p, int64_t bytes) {
  const int64_t off = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 65536;
  if (off >= bytes) return;
  const uint32_t n = static_cast<uint32_t>(bytes - off < 65536 ? bytes - off : 65536);
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
}

__global__ void PrefetchLinesKernel(const char* p, int64_t bytes) {
  for (int64_t off = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 128; off < bytes;
       off += int64_t{gridDim.x} * blockDim.x * 128) {
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + off));
  }
}

int Prefetch(cudaStream_t s) {
  cudaStream_t side;
  cudaEvent_t fork, join;
  LAB_CHECK(cudaStreamCreate(&side));
  LAB_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  LAB_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  // Six distinct o_a-sized weights in turn, so no GEMV finds its weights in L2 from the last one.
  const int64_t rows = 8192, k = 4096, copies = 6, bytes = rows * k * 2;
  bf16* w = DeviceFill<bf16>(rows * k * copies, 0x3c);
  float* x = DeviceFill<float>(k, 0);
  float* y = DeviceFill<float>(rows, 0);
  float* t0 = DeviceFill<float>(4096, 0);
  float* t1 = DeviceFill<float>(4096, 0);
  int dev = 0, l2 = 0;
  LAB_CHECK(cudaGetDevice(&dev));
  LAB_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  std::printf("L2 %d MB; each step: N small kernels then a %lld MB GEMV (R1 U4 T128)\n", l2 >> 20,
              static_cast<long long>(bytes >> 20));
  const Variant v = MakeVariant<1, 4, 128>("R1 U4 T128");
  const char* modes[] = {"none", "bulk", "lines"};
  for (int tinies : {0, 8, 16}) {
    for (int mode = 0; mode < 3; ++mode) {
      for (int64_t mb : {8, 16, 24, 32, 48}) {
        if (mode == 0 && mb != 8) continue;
        const double us = GraphMicros(s, 20, [&] {
          for (int64_t i = 0; i < copies; ++i) {
            const bf16* wi = w + i * rows * k;
            if (mode > 0) {
              LAB_CHECK(cudaEventRecord(fork, s));
              LAB_CHECK(cudaStreamWaitEvent(side, fork, 0));
              const int64_t pb = mb << 20;
              if (mode == 1) {
                PrefetchBulkKernel<<<static_cast<unsigned>((pb / 65536 + 127) / 128), 128, 0,
                                     side>>>(reinterpret_cast<const char*>(wi), pb);
              } else {
                PrefetchLinesKernel<<<264, 256, 0, side>>>(reinterpret_cast<const char*>(wi), pb);
              }
              LAB_CHECK(cudaEventRecord(join, side));
            }
            for (int j = 0; j < tinies; ++j) TinyKernel<<<1, 256, 0, s>>>(j % 2 ? t1 : t0, j % 2 ? t0 : t1);
            if (mode > 0) LAB_CHECK(cudaStreamWaitEvent(s, join, 0));
            LaunchRows(v, false, s, x, wi, k, rows, y);
          }
        });
        std::printf("tiny=%2d %-5s prefetch %2lld MB: %7.1f us per step\n", tinies, modes[mode],
                    static_cast<long long>(mode ? mb : 0), us / copies);
      }
    }
  }
  return 0;
}

}  // namespace

// ---- overlap lab: what a PDL-launched GEMV can do while the previous kernel finishes ----
// kPrefetch: before griddepcontrol.wait, one lane per warp asks L2 for the warp's whole rows
// (cp.async.bulk.prefetch.L2, fire and forget), so the wait overlaps HBM traffic of this grid
// instead of idling. kW: warps per row (split-K inside the block, reduced through shared memory
// in warp order; kW = 1 is RowsKernel's shape).
template <int kW, int U, int T, bool kPrefetch>
__global__ void __launch_bounds__(T) OverlapKernel(const float* x, const bf16* w, int64_t k,
                                                   int64_t rows, float* y) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  __shared__ float part[T / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = int64_t{blockIdx.x} * (T / 32 / kW) + warp / kW;
  const int slice = warp % kW;
  const int64_t klen = (k / kW + 255) / 256 * 256;  // whole 256-chunks per warp slice
  const int64_t k0 = slice * klen, k1 = k0 + klen < k ? k0 + klen : k;
  const bool live = row < rows && k0 < k;
  if (kPrefetch && live && lane == 0) {
    const bf16* p = w + row * k + k0;
    const uint32_t bytes = static_cast<uint32_t>((k1 - k0) * 2);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
  }
  float acc = 0.0f;
  uint4 v[U];
  bool waited = false;
  if (live) {
    for (int64_t base = k0; base < k1; base += U * 256) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kk = base + u * 256 + lane * 8;
        v[u] = kk < k1 ? LoadWeights(w + row * k + kk) : make_uint4(0, 0, 0, 0);
      }
      if (!waited) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        waited = true;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kk = base + u * 256 + lane * 8;
        if (kk < k1) acc = Dot8(v[u], x + kk, acc);
      }
    }
  }
  if (!waited) asm volatile("griddepcontrol.wait;" ::: "memory");
  acc = WarpSum(acc);
  if (kW == 1) {
    if (lane == 0 && row < rows) y[row] = acc;
    return;
  }
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (slice == 0 && lane == 0 && row < rows) {
    float sum = part[warp];
    for (int q = 1; q < kW; ++q) sum += part[warp + q];
    y[row] = sum;
  }
}

// The expert kernels' shape: R rows per group, row r of group g = w[(r * groups + g) * k] (rows
// far apart, as the slots of different experts are), each against its own x (x + r * k when
// kOwnX, as the down projection's per-slot h), kW warps per group splitting k; sums in slot order.
template <int R, int U, int kW, int T, bool kOwnX>
__global__ void __launch_bounds__(T) MultiRowKernel(const float* x, const bf16* w, int64_t k,
                                                    int64_t groups, float* y) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  __shared__ float part[T / 32][R];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t g = int64_t{blockIdx.x} * (T / 32 / kW) + warp / kW;
  const int slice = warp % kW;
  const int64_t klen = kW == 1 ? k : ((k + kW - 1) / kW + 255) / 256 * 256;
  const int64_t k0 = slice * klen < k ? slice * klen : k;
  const int64_t k1 = k0 + klen < k ? k0 + klen : k;
  const bool live = g < groups;
  float acc[R] = {};
  uint4 v[R][U];
  bool waited = false;
  if (live) {
    for (int64_t base = k0; base < k1; base += U * 256) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t kk = base + u * 256 + lane * 8;
          v[r][u] = kk < k1 ? LoadWeights(w + (r * groups + g) * k + kk) : make_uint4(0, 0, 0, 0);
        }
      }
      if (!waited) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        waited = true;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kk = base + u * 256 + lane * 8;
        if (kk < k1) {
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r] = Dot8(v[r][u], x + (kOwnX ? r * k : 0) + kk, acc[r]);
        }
      }
    }
  }
  if (!waited) asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = WarpSum(acc[r]);
  if (kW > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) part[warp][r] = acc[r];
    }
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float sum = part[warp][r];
      for (int q = 1; q < kW; ++q) sum += part[warp + q][r];
      acc[r] = sum;
    }
  }
  if (live && lane == 0) {
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) sum += acc[r];
    y[g] = sum;
  }
}

// A small dependent op that lets its dependents launch at once (as the model's norms do).
__global__ void TinyPdlKernel(const float* a, float* b) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = threadIdx.x; i < 4096; i += blockDim.x) b[i] = a[i] * 0.5f + 1.0f;
}

struct OverlapVariant {
  const char* name;
  RowsFn fn;
  int warps_per_row, threads;
};

void LaunchPdlRows(const OverlapVariant& v, cudaStream_t s, const float* x, const bf16* w,
                   int64_t k, int64_t rows, float* y) {
  const int64_t per_block = v.threads / 32 / v.warps_per_row;
  Launch(v.fn, (rows + per_block - 1) / per_block, v.threads, true, s, x, w, k, rows, y);
}

void LaunchTinyPdl(cudaStream_t s, const float* a, float* b) {
  Launch(TinyPdlKernel, 1, 256, true, s, a, b);
}

int Overlap(cudaStream_t s) {
  const std::vector<Shape> chain = DecodeChain();
  size_t total = 0;
  for (const Shape& c : chain) total += c.n * c.k;
  bf16* pool = DeviceFill<bf16>(total, 0x3c);
  float* x = DeviceFill<float>(1 << 18, 0);
  float* y = DeviceFill<float>(129280, 0);
  float* z = DeviceFill<float>(4096, 0);
  const std::vector<OverlapVariant> variants = {
      {"W1 U4 T128", OverlapKernel<1, 4, 128, false>, 1, 128},
      {"W1 U4 T128 pf", OverlapKernel<1, 4, 128, true>, 1, 128},
      {"W2 U4 T128", OverlapKernel<2, 4, 128, false>, 2, 128},
      {"W2 U4 T128 pf", OverlapKernel<2, 4, 128, true>, 2, 128},
      {"W4 U4 T128", OverlapKernel<4, 4, 128, false>, 4, 128},
      {"W4 U4 T128 pf", OverlapKernel<4, 4, 128, true>, 4, 128},
      {"W2 U2 T128", OverlapKernel<2, 2, 128, false>, 2, 128},
      {"W2 U2 T128 pf", OverlapKernel<2, 2, 128, true>, 2, 128},
      {"W2 U1 T128", OverlapKernel<2, 1, 128, false>, 2, 128},
      {"W4 U2 T128", OverlapKernel<4, 2, 128, false>, 4, 128},
      {"W4 U1 T128", OverlapKernel<4, 1, 128, false>, 4, 128},
      {"W1 U2 T128", OverlapKernel<1, 2, 128, false>, 1, 128},
      {"W2 U2 T64", OverlapKernel<2, 2, 64, false>, 2, 64},
      {"W8 U1 T256", OverlapKernel<8, 1, 256, false>, 8, 256},
      {"W2 U2 T256", OverlapKernel<2, 2, 256, false>, 2, 256},
      {"W4 U2 T256", OverlapKernel<4, 2, 256, false>, 4, 256},
      {"W2 U3 T128", OverlapKernel<2, 3, 128, false>, 2, 128},
  };
  // ex_gu6 / ex_dn7: the 6 routed experts' gate/up rows and the 7 slots' down rows stacked as
  // one GEMV each (what the single-token expert kernels stream).
  const std::vector<Shape> singles = {{"q_a", 1024, 4096},      {"q_b", 32768, 1024},
                                      {"o_b", 4096, 8192},      {"o_a", 8192, 4096},
                                      {"sh_gu", 4096, 4096},    {"sh_dn", 4096, 2048},
                                      {"ex_gu6", 24576, 4096},  {"ex_dn7", 28672, 2048}};
  TableHeader("PDL chains of one shape (8 calls in a graph), us per call (GB/s); W warps per row, "
              "pf = L2 bulk prefetch of the rows before the wait\n",
              16, singles);
  for (const OverlapVariant& v : variants) {
    Row(v.name, 16, singles, [&](const Shape& sh) {
      return GraphMicros(s, 20, [&] {
               for (int i = 0; i < 8; ++i) LaunchPdlRows(v, s, x, pool, sh.k, sh.n, y);
             }) / 8;
    });
  }
  // The experts at one token: gate/up of 6 routed slots (2 rows per group, shared x) and the
  // down projection of 7 slots (7 rows per group, one x per slot), each 8 calls in a PDL graph.
  struct MultiVariant {
    const char* name;
    RowsFn gu, dn;
    int kw, threads;
  };
  const std::vector<MultiVariant> multi = {
      {"W1 U2 T128", MultiRowKernel<2, 2, 1, 128, false>, MultiRowKernel<7, 1, 1, 128, true>, 1, 128},
      {"W2 U2 T128 (now)", MultiRowKernel<2, 2, 2, 128, false>, MultiRowKernel<7, 1, 2, 128, true>, 2, 128},
      {"W2 U1 T128", MultiRowKernel<2, 1, 2, 128, false>, MultiRowKernel<7, 1, 2, 128, true>, 2, 128},
      {"W2 U2 T256", MultiRowKernel<2, 2, 2, 256, false>, MultiRowKernel<7, 1, 2, 256, true>, 2, 256},
      {"W2 U1 T256", MultiRowKernel<2, 1, 2, 256, false>, MultiRowKernel<7, 1, 2, 256, true>, 2, 256},
      {"W4 U1 T256", MultiRowKernel<2, 1, 4, 256, false>, MultiRowKernel<7, 1, 4, 256, true>, 4, 256},
      {"W4 U2 T256", MultiRowKernel<2, 2, 4, 256, false>, MultiRowKernel<7, 1, 4, 256, true>, 4, 256},
      {"W8 U1 T256", MultiRowKernel<2, 1, 8, 256, false>, MultiRowKernel<7, 1, 8, 256, true>, 8, 256},
  };
  std::printf("\nexperts at one token, PDL graph of 8 calls: gate/up 6 slots (R2, 201 MB), down 7 "
              "slots (R7, 117 MB), us per call (GB/s)\n");
  for (const MultiVariant& v : multi) {
    auto launch = [&](RowsFn fn, int64_t k, int64_t groups) {
      const int64_t per_block = v.threads / 32 / v.kw;
      Launch(fn, (groups + per_block - 1) / per_block, v.threads, true, s,
             static_cast<const float*>(x), static_cast<const bf16*>(pool), k, groups, y);
    };
    const double gu = GraphMicros(s, 20, [&] { for (int i = 0; i < 8; ++i) launch(v.gu, 4096, 6 * 2048); }) / 8;
    const double dn = GraphMicros(s, 20, [&] { for (int i = 0; i < 8; ++i) launch(v.dn, 2048, 4096); }) / 8;
    const double both = GraphMicros(s, 20, [&] {
                          for (int i = 0; i < 8; ++i) {
                            launch(v.gu, 4096, 6 * 2048);
                            launch(v.dn, 2048, 4096);
                          }
                        }) / 8;
    std::printf("%-18s gate/up %6.1f (%5.0f)  down %6.1f (%5.0f)  pair %6.1f us\n", v.name, gu,
                201.3e3 / gu, dn, 117.4e3 / dn, both);
  }

  std::printf("\ngraph of the decode chain (PDL): %zu GEMVs, %.1f MB, roofline %.1f us; tiny=1 "
              "puts a small PDL kernel (triggering at once) before each GEMV\n",
              chain.size(), total * 2 / 1e6, total * 2 / 4.8e6);
  for (const OverlapVariant& v : variants) {
    for (int tiny = 0; tiny < 2; ++tiny) {
      const double us = GraphMicros(s, 20, [&] {
        size_t off = 0;
        for (const Shape& c : chain) {
          if (tiny) LaunchTinyPdl(s, y, z);
          LaunchPdlRows(v, s, x, pool + off, c.k, c.n, y);
          off += c.n * c.k;
        }
      });
      std::printf("%-16s tiny=%d %8.1f us/step %6.0f GB/s\n", v.name, tiny, us,
                  total * 2 / us / 1e3);
    }
  }
  return 0;
}

// ---- bulk lab: weights streamed by the bulk copy engine into a shared-memory ring ----
// Nsight Compute (bench/results/h200-2026-11-30d/round3/ncu_detail.txt) puts the model's GEMVs at
// 54-80 % of the HBM rate and cuBLASLt's lm_head at 92 % with 15 % occupancy: a few large
// transfers in flight per block instead of many 16-byte loads per lane. This kernel tries that
// for single-token GEMVs: persistent blocks, each over row groups g = blockIdx.x + i * gridDim.x
// of 8 rows (one warp per row); thread 0 keeps kStages stages in flight, a stage being kChunk
// elements of each of the 8 rows (cp.async.bulk, completion counted on the stage's mbarrier);
// the warps wait on the stage, dot their row's chunk against x, and after a block barrier the
// stage is refilled with the item kStages ahead. Needs rows % 8 == 0 and k % 8 == 0.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "LAB_MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LAB_MBAR_WAIT_%=;\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

constexpr int kBulkRows = 8;  // rows per group: one warp each (256 threads)

template <int kStages, int kChunk>
constexpr size_t BulkSmem() {
  return sizeof(bf16) * kStages * kBulkRows * kChunk + sizeof(uint64_t) * kStages;
}

template <int kStages, int kChunk>
__global__ void __launch_bounds__(kBulkRows * 32) BulkKernel(const float* x, const bf16* w,
                                                             int64_t k, int64_t rows, float* y) {
  static_assert(kChunk % 256 == 0, "a chunk is whole 256-element lane passes");
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* stage = reinterpret_cast<bf16*>(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + sizeof(bf16) * kStages * kBulkRows * kChunk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t groups = rows / kBulkRows;
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  const int64_t mine =
      groups > blockIdx.x ? (groups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const int64_t items = mine * chunks;  // item j: group blockIdx.x + (j / chunks) * gridDim.x
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) MbarInit(&full[st], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int64_t j) {  // thread 0
    const int st = static_cast<int>(j % kStages);
    const int64_t g = blockIdx.x + (j / chunks) * gridDim.x;
    const int64_t k0 = (j % chunks) * kChunk;
    const uint32_t bytes =
        static_cast<uint32_t>(sizeof(bf16) * (k - k0 < kChunk ? k - k0 : kChunk));
    MbarExpectTx(&full[st], bytes * kBulkRows);
    for (int r = 0; r < kBulkRows; ++r) {
      BulkLoad(stage + (st * kBulkRows + r) * kChunk, w + (g * kBulkRows + r) * k + k0, bytes,
               &full[st]);
    }
  };
  if (threadIdx.x == 0) {
    for (int64_t j = 0; j < items && j < kStages; ++j) issue(j);
  }
  float acc = 0.0f;
  for (int64_t j = 0; j < items; ++j) {
    const int st = static_cast<int>(j % kStages);
    MbarWait(&full[st], static_cast<uint32_t>((j / kStages) & 1));
    const int64_t g = blockIdx.x + (j / chunks) * gridDim.x;
    const int64_t c = j % chunks, k0 = c * kChunk;
    const int64_t len = k - k0 < kChunk ? k - k0 : kChunk;
    const bf16* row = stage + (st * kBulkRows + warp) * kChunk;
#pragma unroll
    for (int e = 0; e < kChunk; e += 256) {
      const int64_t kk = e + lane * 8;
      if (kk < len) acc = Dot8(*reinterpret_cast<const uint4*>(row + kk), x + k0 + kk, acc);
    }
    if (c == chunks - 1) {
      const float sum = WarpSum(acc);
      if (lane == 0) y[g * kBulkRows + warp] = sum;
      acc = 0.0f;
    }
    __syncthreads();  // every warp is done with stage st
    if (threadIdx.x == 0 && j + kStages < items) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(j + kStages);
    }
  }
}

struct BulkVariant {
  const char* name;
  RowsFn fn;
  size_t smem;
  int blocks_per_sm;
};
template <int kStages, int kChunk>
BulkVariant MakeBulk(const char* name, int blocks_per_sm) {
  auto fn = BulkKernel<kStages, kChunk>;
  LAB_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(BulkSmem<kStages, kChunk>())));
  return BulkVariant{name, fn, BulkSmem<kStages, kChunk>(), blocks_per_sm};
}

void LaunchBulk(const BulkVariant& v, int sms, cudaStream_t s, const float* x, const bf16* w,
                int64_t k, int64_t rows, float* y) {
  const int64_t groups = rows / kBulkRows;
  const int64_t blocks = groups < int64_t{sms} * v.blocks_per_sm ? groups
                                                                  : int64_t{sms} * v.blocks_per_sm;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kBulkRows * 32);
  cfg.dynamicSmemBytes = v.smem;
  cfg.stream = s;
  LAB_CHECK(cudaLaunchKernelEx(&cfg, v.fn, x, w, k, rows, y));
}

// Deterministic non-constant weights and activations (so a mis-mapped row shows).
__global__ void FillPatternKernel(bf16* w, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    w[i] = __float2bfloat16_rn((static_cast<float>(h >> 24) - 127.5f) * (1.0f / 4096));
  }
}

int Bulk(cudaStream_t s) {
  int sms = 0;
  LAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::vector<Shape> chain = DecodeChain();
  size_t total = 0;
  for (const Shape& c : chain) total += c.n * c.k;
  bf16* pool = nullptr;
  LAB_CHECK(cudaMalloc(&pool, total * sizeof(bf16)));
  FillPatternKernel<<<4096, 256, 0, s>>>(pool, static_cast<int64_t>(total));
  LAB_CHECK(cudaGetLastError());
  std::vector<float> hx(1 << 16);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = static_cast<float>(static_cast<int>(i % 13) - 6) / 8;
  float* x = DeviceFill<float>(hx.size(), 0);
  LAB_CHECK(cudaMemcpy(x, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
  float* y_ref = DeviceFill<float>(129280, 0);
  float* y = DeviceFill<float>(129280, 0);
  const Variant ref = MakeVariant<1, 2, 256>("R1 U2 T256");  // the model's shape below k 2048
  const std::vector<BulkVariant> variants = {
      MakeBulk<4, 1024>("S4 C1024 B2", 2), MakeBulk<4, 1024>("S4 C1024 B3", 3),
      MakeBulk<2, 2048>("S2 C2048 B3", 3), MakeBulk<6, 512>("S6 C512 B3", 3),
      MakeBulk<8, 512>("S8 C512 B2", 2),   MakeBulk<3, 1024>("S3 C1024 B4", 4)};
  const std::vector<Shape> singles = {{"q_a", 1024, 4096},   {"q_b", 32768, 1024},
                                      {"o_b", 4096, 8192},   {"o_a", 8192, 4096},
                                      {"sh_gu", 4096, 4096}, {"ex_dn", 4096, 2048},
                                      {"lm_head", 129280, 4096}};
  // Correctness first: each variant against the 16-byte-load kernel on every shape (the sums
  // differ only in order: relative difference ~1e-6); outputs poisoned before each run.
  std::printf("max |bulk - rows| / max |rows| per shape (poisoned outputs; must be < 1e-4)\n");
  int bad = 0;
  for (const BulkVariant& v : variants) {
    std::printf("%-14s", v.name);
    for (const Shape& sh : singles) {
      std::vector<float> a(sh.n), b(sh.n);
      LAB_CHECK(cudaMemset(y_ref, 0xff, sh.n * sizeof(float)));
      LAB_CHECK(cudaMemset(y, 0xff, sh.n * sizeof(float)));
      LaunchRows(ref, false, s, x, pool, sh.k, sh.n, y_ref);
      LaunchBulk(v, sms, s, x, pool, sh.k, sh.n, y);
      LAB_CHECK(cudaStreamSynchronize(s));
      LAB_CHECK(cudaMemcpy(a.data(), y_ref, sh.n * sizeof(float), cudaMemcpyDeviceToHost));
      LAB_CHECK(cudaMemcpy(b.data(), y, sh.n * sizeof(float), cudaMemcpyDeviceToHost));
      double worst = 0, scale = 0;
      for (int64_t i = 0; i < sh.n; ++i) {
        const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
        worst = d == d ? (d > worst ? d : worst) : 1e30;  // NaN: an unwritten output
        scale = std::fabs(a[i]) > scale ? std::fabs(a[i]) : scale;
      }
      const double rel = worst / (scale > 0 ? scale : 1);
      bad += rel < 1e-4 ? 0 : 1;
      std::printf(" %8s %8.1e", sh.name, rel);
    }
    std::printf("\n");
  }
  TableHeader("\nback to back, us per call (GB/s); S stages, C elements per row per stage, B "
              "blocks per SM\n",
              14, singles);
  TimeRow(s, ref.name, singles,
          [&](const Shape& sh) { LaunchRows(ref, false, s, x, pool, sh.k, sh.n, y); });
  for (const BulkVariant& v : variants) {
    TimeRow(s, v.name, singles,
            [&](const Shape& sh) { LaunchBulk(v, sms, s, x, pool, sh.k, sh.n, y); });
  }
  std::printf("\ngraph of the decode chain: %zu GEMVs, %.1f MB, roofline %.1f us at 4.8 TB/s\n",
              chain.size(), total * 2 / 1e6, total * 2 / 4.8e6);
  // One graph of the chain, each GEMV through launch(weights, shape).
  auto chain_row = [&](const char* name, auto launch) {
    const double us = GraphMicros(s, 20, [&] {
      size_t off = 0;
      for (const Shape& c : chain) {
        launch(pool + off, c);
        off += c.n * c.k;
      }
    });
    std::printf("%-14s %8.1f us/step %6.0f GB/s\n", name, us, total * 2 / us / 1e3);
  };
  chain_row(ref.name, [&](const bf16* w, const Shape& c) {
    LaunchRows(ref, false, s, x, w, c.k, c.n, y);
  });
  for (const BulkVariant& v : variants) {
    chain_row(v.name, [&](const bf16* w, const Shape& c) {
      LaunchBulk(v, sms, s, x, w, c.k, c.n, y);
    });
  }
  return bad == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "";
  cudaStream_t s;
  LAB_CHECK(cudaStreamCreate(&s));
  if (!std::strcmp(what, "gemv")) return Gemv(s);
  if (!std::strcmp(what, "moe")) return Moe(s);
  if (!std::strcmp(what, "prefetch")) return Prefetch(s);
  if (!std::strcmp(what, "overlap")) return Overlap(s);
  if (!std::strcmp(what, "bulk")) return Bulk(s);
  std::fprintf(stderr, "usage: %s gemv|moe|prefetch|overlap|bulk\n", argv[0]);
  return 2;
}
