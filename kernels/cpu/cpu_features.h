// Which of the CPU's optional kernels (AVX-512 panels and tiles) the process uses: those the CPU
// runs, unless RISKKV_CPU_KERNELS=avx2 in the environment restricts it to the AVX2 kernels every
// supported CPU runs (to measure or test that path on an AVX-512 machine). Every kernel gives
// the same bits, so the choice changes only speed.
#pragma once

namespace riskkv::cpu {

// False when RISKKV_CPU_KERNELS is "avx2"; true when it is unset, empty or "auto". Any other
// value is reported once on stderr (naming it and the accepted ones) and taken as "auto".
bool Avx512KernelsAllowed();

}  // namespace riskkv::cpu
