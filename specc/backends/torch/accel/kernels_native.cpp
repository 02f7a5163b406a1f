// specc's native GEMV: y[r, o] = x[r, :] . w[o, :] (+ b[o]) for the few rows of a decoding step: fp32 x, b, y
// and accumulation; w in fp32 or bf16 (widened to fp32 as it is read: bf16 decoding streams half the bytes).
//
// Decoding streams every weight once per token, so the kernel's only job is to read w at the memory's speed:
// each thread takes one contiguous block of w's rows and reads it as a few long sequential streams at once
// (more cache lines in flight than one stream), keeps x (a few KB) in L1, and hints rows a few rows ahead into
// the cache. Up to 4 rows of x share one pass over w.
// Compiled at first use on the machine that runs it (-march=native) and linked to the OpenMP runtime torch
// itself uses, so its threads are torch's threads.
#include <omp.h>

#include "native_gemv.h"

using namespace specc_native;

namespace {
template <typename W>
void gemv(const float* x, const W* w, const float* b, float* y, int64_t rows, int64_t n_in, int64_t n_out,
          int threads) {
#pragma omp parallel num_threads(threads)
  gemv_share(x, w, b, y, rows, n_in, n_out, omp_get_thread_num(), omp_get_num_threads());
}
}  // namespace

// x: [rows, n_in] fp32, w: [n_out, n_in], b: [n_out] fp32 or null, y: [rows, n_out] fp32; all contiguous.
extern "C" void specc_gemv_f32(const float* x, const float* w, const float* b, float* y, int64_t rows,
                               int64_t n_in, int64_t n_out, int threads) {
  gemv(x, w, b, y, rows, n_in, n_out, threads);
}
extern "C" void specc_gemv_bf16(const float* x, const uint16_t* w, const float* b, float* y, int64_t rows,
                                int64_t n_in, int64_t n_out, int threads) {
  gemv(x, w, b, y, rows, n_in, n_out, threads);
}

// The ABI check the loader makes before trusting the library.
extern "C" int specc_gemv_version() { return 3; }
