// exp over AVX2 vectors from glibc's vector math library (libmvec): expf on eight floats and exp
// on four doubles, within 4 ulp of the exact value (glibc's stated bound). Each lane's result
// depends on that lane's input alone, so the softmax, SiLU and log-sum-exp built on them give
// the same bits whatever the batch and the thread. Across machines the bits are those of
// glibc's implementation for CPUs with AVX2 and FMA, which glibc selects on every CPU the
// kernels run on: nodes agree when they run the same glibc (the same image) and no
// GLIBC_TUNABLES setting hides AVX2 or FMA from it (glibc then takes its SSE fallback, whose
// bits differ), as they already had to for the scalar exp.
#pragma once

#include <immintrin.h>

extern "C" __m256 _ZGVdN8v_expf(__m256 x);
extern "C" __m256d _ZGVdN4v_exp(__m256d x);

namespace riskkv::cpu {

inline __m256 Exp8(__m256 x) { return _ZGVdN8v_expf(x); }
inline __m256d Exp4(__m256d x) { return _ZGVdN4v_exp(x); }

}  // namespace riskkv::cpu
