// The GEMV core both native libraries share (kernels_native.cpp, decode_native.cpp): y[r, o] = x[r, :] . w[o, :]
// (+ b[o]) over a block of w's rows [o0, o1), read as a few long sequential streams at once.
#pragma once
#include <cstdint>
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace specc_native {
// 8 floats (one AVX register where the CPU has them); aligned(4): loads and stores may be unaligned
typedef float vf __attribute__((vector_size(32), aligned(4)));
typedef uint16_t vh __attribute__((vector_size(16), aligned(2)));  // 8 bf16
typedef uint32_t vu __attribute__((vector_size(32)));

inline vf load8(const float* p) { return *reinterpret_cast<const vf*>(p); }
inline vf load8(const uint16_t* p) {  // bf16 → fp32: the 16 bits are the top half of the float
#ifdef __AVX2__  // one widening load (the generic form below compiles to two halves and an insert)
  const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  return reinterpret_cast<vf>(_mm256_castsi256_ps(u));
#else
  return reinterpret_cast<vf>(__builtin_convertvector(*reinterpret_cast<const vh*>(p), vu) << 16);  // a bitcast
#endif
}
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) {
  const uint32_t u = uint32_t(*p) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
constexpr int V = 16;     // floats per step: one 64-byte cache line of w, two vector accumulators per row
constexpr int AHEAD = 8;  // rows of w ahead of the current one that are hinted into the cache
// streams per thread for 1, 2 and 3–4 rows of x (measured on GPT-2's shapes; more rows keep more accumulators)
constexpr int S1 = 4, S2 = 2, S3 = 2;

// R rows of x against S rows of w per pass. The block [o0, o1) is read as S streams, each a contiguous run of
// q rows (stream s: rows o0 + s·q + j, j = 0..q-1): several long sequential streams per core keep more cache
// lines in flight than one (measured faster for every GPT-2 shape; with S adjacent rows per pass instead,
// rows of a few KB restart their streams every row and read no faster than one stream). 2·R·S vector
// accumulators, all in registers.
template <int R, int S, typename W>
void rows_block(const float* x, const W* w, const float* b, float* y, int64_t n_in, int64_t n_out,
                int64_t o0, int64_t o1) {
  const int64_t main = n_in - n_in % V;
  const int64_t q = (o1 - o0) / S;
  for (int64_t j = 0; j < q; ++j) {
    const W* wr[S];
    for (int s = 0; s < S; ++s) {
      wr[s] = w + (o0 + s * q + j) * n_in;
      if (j + AHEAD < q) __builtin_prefetch(wr[s] + AHEAD * n_in, 0, 0);
    }
    vf lo[S][R], hi[S][R];  // no stores in the loop: nothing can alias w's loads
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < R; ++r) lo[s][r] = hi[s][r] = vf{};
    for (int64_t i = 0; i < main; i += V) {
      for (int r = 0; r < R; ++r) {
        const vf x0 = *reinterpret_cast<const vf*>(x + r * n_in + i);
        const vf x1 = *reinterpret_cast<const vf*>(x + r * n_in + i + 8);
        for (int s = 0; s < S; ++s) {
          lo[s][r] += load8(wr[s] + i) * x0;
          hi[s][r] += load8(wr[s] + i + 8) * x1;
        }
      }
    }
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < R; ++r) {
        const vf v = lo[s][r] + hi[s][r];
        float t = 0.f;
        for (int k = 0; k < 8; ++k) t += v[k];
        for (int64_t i = main; i < n_in; ++i) t += load1(wr[s] + i) * x[r * n_in + i];
        const int64_t o = o0 + s * q + j;
        y[r * n_out + o] = b ? t + b[o] : t;
      }
  }
  if (S > 1 && o0 + S * q < o1) rows_block<R, 1, W>(x, w, b, y, n_in, n_out, o0 + S * q, o1);  // the rest
}

// The rows of one thread of `n` (each thread takes one contiguous block of w's rows).
inline void thread_rows(int64_t n_out, int64_t t, int64_t n, int64_t* o0, int64_t* o1) {
  const int64_t per = (n_out + n - 1) / n;
  *o0 = t * per < n_out ? t * per : n_out;
  *o1 = *o0 + per < n_out ? *o0 + per : n_out;
}

// One thread's share (thread t of n) of rows x rows of x against w, rows at a time by 4.
template <typename W>
void gemv_share(const float* x, const W* w, const float* b, float* y, int64_t rows, int64_t n_in, int64_t n_out,
                int64_t t, int64_t n) {
  int64_t o0, o1;
  thread_rows(n_out, t, n, &o0, &o1);
  for (int64_t r = 0; r < rows && o0 < o1; r += 4) {
    const float* xr = x + r * n_in;
    float* yr = y + r * n_out;
    switch (rows - r) {
      case 1: rows_block<1, S1>(xr, w, b, yr, n_in, n_out, o0, o1); break;
      case 2: rows_block<2, S2>(xr, w, b, yr, n_in, n_out, o0, o1); break;
      case 3: rows_block<3, S3>(xr, w, b, yr, n_in, n_out, o0, o1); break;
      default: rows_block<4, S3>(xr, w, b, yr, n_in, n_out, o0, o1);
    }
  }
}
}  // namespace specc_native
