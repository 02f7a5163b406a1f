// specc's native GEMV: y[r, o] = x[r, :] . w[o, :] (+ b[o]) in fp32, for the few rows of a decoding step.
//
// Decoding streams every weight once per token, so the kernel's only job is to read w at the memory's speed:
// each thread takes one contiguous block of w's rows (one sequential stream, as a plain sum() reads), keeps
// x (a few KB) in L1, and hints the row a few rows ahead into the cache. Up to 4 rows of x share one pass over
// w. Compiled at first use on the machine that runs it (-march=native) and linked to the OpenMP runtime torch
// itself uses, so its threads are torch's threads.
#include <cstdint>
#include <omp.h>

namespace {
// 8 floats (one AVX register where the CPU has them); aligned(4): loads and stores may be unaligned
typedef float vf __attribute__((vector_size(32), aligned(4)));
constexpr int V = 16;     // floats per step: one 64-byte cache line of w, two vector accumulators per row
constexpr int AHEAD = 8;  // rows of w ahead of the current one that are hinted into the cache

template <int R>
void rows_block(const float* x, const float* w, const float* b, float* y, int64_t n_in, int64_t n_out,
                int64_t o0, int64_t o1) {
  const int64_t main = n_in - n_in % V;
  for (int64_t o = o0; o < o1; ++o) {
    const float* wr = w + o * n_in;
    if (o + AHEAD < o1) __builtin_prefetch(wr + AHEAD * n_in, 0, 0);
    vf lo[R], hi[R];  // the accumulators live in registers: no stores that could alias w's loads
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = vf{};
    for (int64_t i = 0; i < main; i += V) {
      const vf w0 = *reinterpret_cast<const vf*>(wr + i), w1 = *reinterpret_cast<const vf*>(wr + i + 8);
      for (int r = 0; r < R; ++r) {
        lo[r] += w0 * *reinterpret_cast<const vf*>(x + r * n_in + i);
        hi[r] += w1 * *reinterpret_cast<const vf*>(x + r * n_in + i + 8);
      }
    }
    for (int r = 0; r < R; ++r) {
      const vf v = lo[r] + hi[r];
      float s = 0.f;
      for (int k = 0; k < 8; ++k) s += v[k];
      for (int64_t i = main; i < n_in; ++i) s += wr[i] * x[r * n_in + i];
      y[r * n_out + o] = b ? s + b[o] : s;
    }
  }
}
}  // namespace

// x: [rows, n_in], w: [n_out, n_in], b: [n_out] or null, y: [rows, n_out]; all contiguous.
extern "C" void specc_gemv_f32(const float* x, const float* w, const float* b, float* y, int64_t rows,
                               int64_t n_in, int64_t n_out, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    const int64_t per = (n_out + n - 1) / n;
    const int64_t o0 = t * per < n_out ? t * per : n_out, o1 = o0 + per < n_out ? o0 + per : n_out;
    for (int64_t r = 0; r < rows && o0 < o1; r += 4) {
      const float* xr = x + r * n_in;
      float* yr = y + r * n_out;
      switch (rows - r) {
        case 1: rows_block<1>(xr, w, b, yr, n_in, n_out, o0, o1); break;
        case 2: rows_block<2>(xr, w, b, yr, n_in, n_out, o0, o1); break;
        case 3: rows_block<3>(xr, w, b, yr, n_in, n_out, o0, o1); break;
        default: rows_block<4>(xr, w, b, yr, n_in, n_out, o0, o1);
      }
    }
  }
}

// The ABI check the loader makes before trusting the library.
extern "C" int specc_gemv_version() { return 1; }
