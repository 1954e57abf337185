// Prefill GEMM lab: what cuBLAS gives at the prefill shapes of the Flash layers, as the baseline and
// the candidate paths of issue #20. Not part of the build (no project code): compile by hand and
// run on the GPU host.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o prefill_gemm_lab bench/lab/prefill_gemm_lab.cu \
//       -lcublasLt -lcublas
//   ./prefill_gemm_lab dense     # the dense projections at 8192 tokens: cuBLASLt bf16 (what the
//                                # backend runs after dequantising FP8 weights) against FP8 with
//                                # DeepSeek's scales (128 x 128 blocks on the weights, 1 x 128 on
//                                # the activations; CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F /
//                                # VEC128_32F), fp32 and bf16 outputs
//   ./prefill_gemm_lab grouped   # the routed experts' gate_up and down at 8192 and 1024 tokens
//                                # (256 experts, ~192 / ~24 assignments each) through
//                                # cublasGemmGroupedBatchedEx in bf16: the peer baseline of the
//                                # tiled expert kernels (kernels/cuda/moe_tiled.cu)
//
// Values are constants (the speed does not depend on them); every figure is the median wall time
// of 20 calls from CUDA events after 5 warm-up calls, and TFLOP/s = 2 M N K / time.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

namespace {

void Check(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s (line %d): %s\n", what, line, cudaGetErrorString(e));
  std::exit(1);
}
#define LAB_CHECK(x) Check((x), #x, __LINE__)

bool Ok(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  std::printf("    %s: cublas status %d\n", what, static_cast<int>(s));
  return false;
}

// Median ms of `f` over 20 calls after 5 warm-up calls.
double TimeMs(const std::function<void()>& f) {
  for (int i = 0; i < 5; ++i) f();
  cudaEvent_t a, b;
  LAB_CHECK(cudaEventCreate(&a));
  LAB_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    LAB_CHECK(cudaEventRecord(a));
    f();
    LAB_CHECK(cudaEventRecord(b));
    LAB_CHECK(cudaEventSynchronize(b));
    float t = 0;
    LAB_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  LAB_CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms[ms.size() / 2];
}

void* Fill(size_t bytes, uint8_t byte) {
  void* p = nullptr;
  LAB_CHECK(cudaMalloc(&p, bytes));
  LAB_CHECK(cudaMemset(p, byte, bytes));
  return p;
}

struct Shape {
  const char* name;
  int64_t n, k;  // weight [n, k]
};
// One Flash layer's dense projections (dsv4-model.md; per-layer shapes of the slice3 config).
const Shape kDense[] = {
    {"wq_a 1024x4096", 1024, 4096},   {"wq_b 32768x1024", 32768, 1024},
    {"wkv 512x4096", 512, 4096},      {"wo_b 4096x8192", 4096, 8192},
    {"shared gate_up 4096x4096", 4096, 4096}, {"shared down 4096x2048", 4096, 2048},
};

// y[m, n] = x[m, k] . w[n, k]^T as cuBLASLt column-major: D (n x m) = W^T (n x k) . X (k x m).
// fp8: A = W e4m3 with 128 x 128 block scales [n/128, k/128] (row-major), B = X e4m3 with 1 x 128
// scales [k/128][m] (m contiguous). Returns the median ms, or -1 when no algorithm is offered.
double LtGemm(cublasLtHandle_t lt, bool fp8, cudaDataType_t dtype, int64_t m, int64_t n, int64_t k,
              const void* w, const void* x, void* y, const float* w_scale, const float* x_scale,
              void* ws, size_t ws_bytes) {
  const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  double ms = -1;
  if (!Ok(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")) return -1;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  bool set = Ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
                "transa") &&
             Ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
                "transb");
  if (fp8) {
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    set = set &&
          Ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                            sizeof(a_mode)),
             "a scale mode") &&
          Ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                            sizeof(b_mode)),
             "b scale mode") &&
          Ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale,
                                            sizeof(w_scale)),
             "a scale pointer") &&
          Ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale,
                                            sizeof(x_scale)),
             "b scale pointer");
  }
  if (!set) {
    cublasLtMatmulDescDestroy(desc);
    return -1;
  }
  cublasLtMatrixLayoutCreate(&la, in, k, n, k);
  cublasLtMatrixLayoutCreate(&lb, in, k, m, k);
  cublasLtMatrixLayoutCreate(&ld, dtype, n, m, n);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &found);
  if (Ok(st, "heuristic") && found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    bool ran = true;
    ms = TimeMs([&] {
      if (!ran) return;
      ran = Ok(cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, y, ld, y, ld, &res.algo, ws,
                              ws_bytes, nullptr),
               "matmul");
    });
    if (!ran) ms = -1;
  } else if (found == 0) {
    std::printf("    no algorithm\n");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  return ms;
}

void Dense() {
  cublasLtHandle_t lt;
  if (!Ok(cublasLtCreate(&lt), "cublasLtCreate")) return;
  const int64_t m = 8192;
  const size_t ws_bytes = 64 << 20;
  void* ws = Fill(ws_bytes, 0);
  std::printf("dense projections, %lld tokens: ms and TFLOP/s (bf16 | fp8->fp32 | fp8->bf16)\n",
              static_cast<long long>(m));
  for (const Shape& s : kDense) {
    const double flop = 2.0 * m * s.n * s.k;
    void* w16 = Fill(s.n * s.k * 2, 0x3c);  // bf16 ~0.01
    void* x16 = Fill(m * s.k * 2, 0x3c);
    void* w8 = Fill(s.n * s.k, 0x30);
    void* x8 = Fill(m * s.k, 0x30);
    std::vector<float> one(std::max<int64_t>((s.n / 128) * (s.k / 128), (s.k / 128) * m), 1.0f);
    float *ws_scale = nullptr, *xs_scale = nullptr;
    LAB_CHECK(cudaMalloc(&ws_scale, one.size() * 4));
    LAB_CHECK(cudaMalloc(&xs_scale, one.size() * 4));
    LAB_CHECK(cudaMemcpy(ws_scale, one.data(), one.size() * 4, cudaMemcpyHostToDevice));
    LAB_CHECK(cudaMemcpy(xs_scale, one.data(), one.size() * 4, cudaMemcpyHostToDevice));
    void* y = Fill(m * s.n * 4, 0);
    const double a = LtGemm(lt, false, CUDA_R_32F, m, s.n, s.k, w16, x16, y, nullptr, nullptr, ws,
                            ws_bytes);
    const double b =
        LtGemm(lt, true, CUDA_R_32F, m, s.n, s.k, w8, x8, y, ws_scale, xs_scale, ws, ws_bytes);
    const double c =
        LtGemm(lt, true, CUDA_R_16BF, m, s.n, s.k, w8, x8, y, ws_scale, xs_scale, ws, ws_bytes);
    auto tf = [&](double ms) { return ms > 0 ? flop / ms / 1e9 : 0.0; };
    std::printf("  %-26s bf16 %.3f ms %.0f TF | fp8->f32 %.3f ms %.0f TF | fp8->bf16 %.3f ms %.0f TF\n",
                s.name, a, tf(a), b, tf(b), c, tf(c));
    for (void* p : {w16, x16, w8, x8, y}) cudaFree(p);
    cudaFree(ws_scale);
    cudaFree(xs_scale);
  }
  cudaFree(ws);
  cublasLtDestroy(lt);
}

// The routed experts as cuBLAS grouped GEMMs: `groups` experts of `rows` assignments each,
// gate_up [2I, D] then down [D, I] per expert, bf16 in and out (fp32 out is not supported).
void Grouped() {
  cublasHandle_t h;
  if (!Ok(cublasCreate(&h), "cublasCreate")) return;
  const int64_t E = 256, D = 4096, I = 2048;
  void* wgu = Fill(E * 2 * I * D * 2, 0x3c);
  void* wdn = Fill(E * D * I * 2, 0x3c);
  for (int64_t tokens : {1024, 8192}) {
    const int64_t rows = tokens * 6 / E;  // assignments an expert, evenly
    const int64_t a = rows * E;
    void* x = Fill(a * D * 2, 0x3c);
    void* hh = Fill(a * I * 2, 0x3c);
    void* y = Fill(a * 2 * I * 4, 0);
    for (int pass = 0; pass < 2; ++pass) {
      const int64_t n = pass == 0 ? 2 * I : D, k = pass == 0 ? D : I;
      const void* in = pass == 0 ? x : hh;
      const char* wbase = static_cast<const char*>(pass == 0 ? wgu : wdn);
      std::vector<const void*> A(E), B(E);
      std::vector<void*> C(E);
      for (int64_t e = 0; e < E; ++e) {
        A[e] = wbase + e * n * k * 2;
        B[e] = static_cast<const char*>(in) + e * rows * k * 2;
        C[e] = static_cast<char*>(y) + e * rows * n * 4;
      }
      const void **dA, **dB;
      void** dC;
      LAB_CHECK(cudaMalloc(&dA, E * sizeof(void*)));
      LAB_CHECK(cudaMalloc(&dB, E * sizeof(void*)));
      LAB_CHECK(cudaMalloc(&dC, E * sizeof(void*)));
      LAB_CHECK(cudaMemcpy(dA, A.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
      LAB_CHECK(cudaMemcpy(dB, B.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
      LAB_CHECK(cudaMemcpy(dC, C.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
      // One group per expert: D (n x rows) = W^T (n x k, stored k-major) . X (k x rows).
      std::vector<cublasOperation_t> ta(E, CUBLAS_OP_T), tb(E, CUBLAS_OP_N);
      std::vector<int> M(E, static_cast<int>(n)), N(E, static_cast<int>(rows)),
          K(E, static_cast<int>(k)), lda(E, static_cast<int>(k)), ldb(E, static_cast<int>(k)),
          ldc(E, static_cast<int>(n)), size(E, 1);
      std::vector<float> alpha(E, 1.0f), beta(E, 0.0f);
      bool ran = true;
      const double ms = TimeMs([&] {
        if (!ran) return;
        ran = Ok(cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), M.data(), N.data(), K.data(),
                                            alpha.data(), dA, CUDA_R_16BF, lda.data(), dB,
                                            CUDA_R_16BF, ldb.data(), beta.data(), dC, CUDA_R_16BF,
                                            ldc.data(), static_cast<int>(E), size.data(),
                                            CUBLAS_COMPUTE_32F),
                 "grouped");
      });
      const double flop = 2.0 * a * n * k;
      std::printf("  grouped %s, %lld tokens (%lld rows x %lld experts): %.3f ms, %.0f TFLOP/s\n",
                  pass == 0 ? "gate_up" : "down", static_cast<long long>(tokens),
                  static_cast<long long>(rows), static_cast<long long>(E), ran ? ms : -1.0,
                  ran ? flop / ms / 1e9 : 0.0);
      cudaFree(dA);
      cudaFree(dB);
      cudaFree(dC);
    }
    for (void* p : {x, hh, y}) cudaFree(p);
  }
  cudaFree(wgu);
  cudaFree(wdn);
  cublasDestroy(h);
}

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "all";
  if (!std::strcmp(what, "dense") || !std::strcmp(what, "all")) Dense();
  if (!std::strcmp(what, "grouped") || !std::strcmp(what, "all")) Grouped();
  return 0;
}
