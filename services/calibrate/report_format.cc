// Formatting shared by the calibration report's outputs (see report_format.h).
#include "services/calibrate/report_format.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace riskkv::report {

std::string F(const char* fmt, ...) {
  va_list a, b;
  va_start(a, fmt);
  va_copy(b, a);
  const int n = std::vsnprintf(nullptr, 0, fmt, a);
  va_end(a);
  std::string s(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
  std::vsnprintf(s.data(), s.size(), fmt, b);
  va_end(b);
  s.pop_back();
  return s;
}

std::string Esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

double Ppl(double nll) { return std::exp(nll); }
double DeltaPplPercent(const DeltaSummary& m) { return 100.0 * (std::exp(m.ci95.mean) - 1.0); }

}  // namespace riskkv::report
