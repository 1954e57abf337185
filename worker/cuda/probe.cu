// Device probe exported by the CUDA plugin (libdsv4_cuda.so): device enumeration, a kernel
// launch checked on the host, and an NCCL all-reduce over every visible GPU. The GPU test
// suites use it to tell "no GPU" (skip) from "GPU present" (must pass).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

void Message(char* out, int len, const char* what, const char* detail) {
  if (out != nullptr && len > 0) std::snprintf(out, static_cast<size_t>(len), "%s: %s", what, detail);
}

__global__ void ScaleAdd(const float* x, const float* y, float a, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}

}  // namespace

extern "C" {

// Number of usable CUDA devices, or -1 with a message (no driver, no device).
__attribute__((visibility("default"))) int dsv4_cuda_device_count(char* msg, int len) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    Message(msg, len, "cudaGetDeviceCount", cudaGetErrorString(err));
    cudaGetLastError();
    return -1;
  }
  if (n > 0) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      Message(msg, len, "device 0", prop.name);
    }
  }
  return n;
}

// out = a * x + y on device 0; returns 0 on success.
__attribute__((visibility("default"))) int dsv4_cuda_scale_add(const float* x, const float* y,
                                                               float a, float* out, int n,
                                                               char* msg, int len) {
  float *dx = nullptr, *dy = nullptr, *dout = nullptr;
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  cudaError_t err = cudaMalloc(&dx, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&dy, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&dout, bytes);
  if (err == cudaSuccess) err = cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaMemcpy(dy, y, bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    ScaleAdd<<<(n + 255) / 256, 256>>>(dx, dy, a, dout, n);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(out, dout, bytes, cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dout);
  if (err != cudaSuccess) {
    Message(msg, len, "scale_add", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}

// Sums rank-dependent buffers (rank r holds r + 1 everywhere) across `ndev` GPUs with one NCCL
// communicator per device; writes rank 0's first element to *result. Returns 0 on success.
__attribute__((visibility("default"))) int dsv4_nccl_allreduce_probe(int ndev, float* result,
                                                                     char* msg, int len) {
  const int n = 1 << 20;
  std::vector<ncclComm_t> comms(ndev);
  std::vector<int> devs(ndev);
  for (int i = 0; i < ndev; ++i) devs[i] = i;
  ncclResult_t nres = ncclCommInitAll(comms.data(), ndev, devs.data());
  if (nres != ncclSuccess) {
    Message(msg, len, "ncclCommInitAll", ncclGetErrorString(nres));
    return 1;
  }
  std::vector<float*> buf(ndev, nullptr);
  std::vector<cudaStream_t> streams(ndev);
  int rc = 0;
  for (int i = 0; i < ndev && rc == 0; ++i) {
    cudaSetDevice(i);
    std::vector<float> host(n, static_cast<float>(i + 1));
    if (cudaMalloc(&buf[i], sizeof(float) * n) != cudaSuccess ||
        cudaMemcpy(buf[i], host.data(), sizeof(float) * n, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaStreamCreate(&streams[i]) != cudaSuccess) {
      Message(msg, len, "setup", cudaGetErrorString(cudaGetLastError()));
      rc = 1;
    }
  }
  if (rc == 0) {
    ncclGroupStart();
    for (int i = 0; i < ndev; ++i) {
      ncclAllReduce(buf[i], buf[i], n, ncclFloat, ncclSum, comms[i], streams[i]);
    }
    nres = ncclGroupEnd();
    if (nres != ncclSuccess) {
      Message(msg, len, "ncclAllReduce", ncclGetErrorString(nres));
      rc = 1;
    }
  }
  for (int i = 0; i < ndev; ++i) {
    cudaSetDevice(i);
    if (rc == 0) cudaStreamSynchronize(streams[i]);
    if (rc == 0 && i == 0) cudaMemcpy(result, buf[0], sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(buf[i]);
    cudaStreamDestroy(streams[i]);
    ncclCommDestroy(comms[i]);
  }
  return rc;
}

}  // extern "C"
