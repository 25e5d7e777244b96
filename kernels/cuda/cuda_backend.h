// cuda_backend.h
// -----------------------------------------------------------------------------
// The kernels of the reference model on an NVIDIA GPU, behind the same
// interface as the CPU backend (backend.h). Every float/int pointer passed to
// a kernel is device memory from Allocate(); the double* outputs of AdamW
// are host memory, and the reductions return to the host (they synchronize).
//
//   std::string why;
//   if (!CudaDeviceAvailable(&why)) { Skip(why); }
//   std::unique_ptr<Backend> gpu = MakeCudaBackend({.device = 0});
//   ModelRunner runner(model, *gpu, batch, seq);   // model_runner.h
//
// Precision: float32 storage and arithmetic; GEMMs through cuBLAS in plain
// FP32, or TF32 tensor cores when `tf32` is set (faster, ~1e-3 relative).
// Determinism: one stream; no atomics; every reduction (layernorm and bias
// gradients, embedding scatter, attention, norms, AdamW's sums) is summed in
// an order that depends only on the problem size, and cuBLAS runs with
// atomics disallowed and a fixed workspace. The same inputs give the same
// bits on every run on the same GPU model, driver and binary.
// Not bit-identical to the CPU backend: sums are ordered differently.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace spikeguard::kernels {

struct CudaBackendOptions {
  int device = 0;
  bool tf32 = false;  // TF32 tensor-core GEMMs instead of FP32
};

// True when a CUDA device can be used; otherwise *why says what is missing
// ("no CUDA device", a driver error, ...).
bool CudaDeviceAvailable(std::string* why);

// Dies (with the CUDA error) when the device cannot be initialized.
std::unique_ptr<Backend> MakeCudaBackend(const CudaBackendOptions& options);

// The device's name, e.g. "NVIDIA H100 80GB HBM3", and its SM count.
struct CudaDeviceInfo {
  std::string name;
  int sm_count = 0;
  int compute_major = 0, compute_minor = 0;
  size_t memory_bytes = 0;
};
CudaDeviceInfo GetCudaDeviceInfo(int device);

}  // namespace spikeguard::kernels
