// specc's native GEMV: y[r, o] = x[r, :] . w[o, :] (+ b[o]) for the few rows of a decoding step: fp32 x, b, y
// and accumulation; w in fp32 or bf16 (widened to fp32 as it is read: bf16 decoding streams half the bytes).
//
// Decoding streams every weight once per token, so the kernel's only job is to read w at the memory's speed:
// each thread takes one contiguous block of w's rows (one sequential stream, as a plain sum() reads), keeps
// x (a few KB) in L1, and hints rows a few rows ahead into the cache. Up to 4 rows of x share one pass over w;
// one or two x rows read two rows of w per pass (measured faster than one, most of all for 12 KB rows).
// Compiled at first use on the machine that runs it (-march=native) and linked to the OpenMP runtime torch
// itself uses, so its threads are torch's threads.
#include <cstdint>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {
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

// R rows of x against P consecutive rows of w per pass: 2·R·P vector accumulators, all in registers.
template <int R, int P, typename W>
void rows_block(const float* x, const W* w, const float* b, float* y, int64_t n_in, int64_t n_out,
                int64_t o0, int64_t o1) {
  const int64_t main = n_in - n_in % V;
  int64_t o = o0;
  for (; o + P <= o1; o += P) {
    const W* wr = w + o * n_in;
    for (int p = 0; p < P; ++p)
      if (o + p + AHEAD < o1) __builtin_prefetch(wr + (p + AHEAD) * n_in, 0, 0);
    vf lo[P][R], hi[P][R];  // no stores in the loop: nothing can alias w's loads
    for (int p = 0; p < P; ++p)
      for (int r = 0; r < R; ++r) lo[p][r] = hi[p][r] = vf{};
    for (int64_t i = 0; i < main; i += V) {
      for (int r = 0; r < R; ++r) {
        const vf x0 = *reinterpret_cast<const vf*>(x + r * n_in + i);
        const vf x1 = *reinterpret_cast<const vf*>(x + r * n_in + i + 8);
        for (int p = 0; p < P; ++p) {
          lo[p][r] += load8(wr + p * n_in + i) * x0;
          hi[p][r] += load8(wr + p * n_in + i + 8) * x1;
        }
      }
    }
    for (int p = 0; p < P; ++p)
      for (int r = 0; r < R; ++r) {
        const vf v = lo[p][r] + hi[p][r];
        float s = 0.f;
        for (int k = 0; k < 8; ++k) s += v[k];
        for (int64_t i = main; i < n_in; ++i) s += load1(wr + p * n_in + i) * x[r * n_in + i];
        y[r * n_out + o + p] = b ? s + b[o + p] : s;
      }
  }
  if (P > 1 && o < o1) rows_block<R, 1, W>(x, w, b, y, n_in, n_out, o, o1);  // an odd last row
}

template <typename W>
void gemv(const float* x, const W* w, const float* b, float* y, int64_t rows, int64_t n_in, int64_t n_out,
          int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    const int64_t per = (n_out + n - 1) / n;
    const int64_t o0 = t * per < n_out ? t * per : n_out, o1 = o0 + per < n_out ? o0 + per : n_out;
    for (int64_t r = 0; r < rows && o0 < o1; r += 4) {
      const float* xr = x + r * n_in;
      float* yr = y + r * n_out;
      switch (rows - r) {
        case 1: rows_block<1, 2>(xr, w, b, yr, n_in, n_out, o0, o1); break;
        case 2: rows_block<2, 2>(xr, w, b, yr, n_in, n_out, o0, o1); break;
        case 3: rows_block<3, 1>(xr, w, b, yr, n_in, n_out, o0, o1); break;
        default: rows_block<4, 1>(xr, w, b, yr, n_in, n_out, o0, o1);
      }
    }
  }
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
extern "C" int specc_gemv_version() { return 2; }
