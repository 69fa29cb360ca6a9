// Formatting shared by the calibration report's HTML, its SVG charts and its JSON, so each figure
// is written the same way wherever it appears.
#pragma once

#include <string>

#include "services/calibrate/calibrate.h"

namespace riskkv::report {

// printf into a std::string; the attribute lets the compiler check every format string.
std::string F(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Escapes text for HTML and SVG element content.
std::string Esc(const std::string& s);

// Perplexity of a mean NLL (nats/token).
double Ppl(double nll);

// The perplexity change, in percent, implied by the mean paired NLL increase.
double DeltaPplPercent(const DeltaSummary& m);

}  // namespace riskkv::report
