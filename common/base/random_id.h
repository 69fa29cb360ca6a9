// Identifiers nobody can guess from another: 128 bits from the kernel's CSPRNG.
#pragma once

#include <string>

namespace riskkv {

// 32 lowercase hex digits from getrandom(2). Aborts when the kernel has no entropy to give: a
// guessable id would hand sessions and migrations out.
std::string RandomId();

}  // namespace riskkv
