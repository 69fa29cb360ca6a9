// --help for the binaries: the program's usage line and every flag it defines (with its default
// and help text), on stdout, exit status 0. absl's own --help lists only the flags of files it
// takes for the program's main file, which for these binaries is none, and exits with status 1.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"

namespace riskkv {

// Whether the arguments ask for help: --help, -help, -h, --helpfull or --helpshort.
inline bool AsksForHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") return false;
    if (a == "-h" || a == "--help" || a == "-help" || a == "--helpfull" || a == "--helpshort") {
      return true;
    }
  }
  return false;
}

// The help text: usage line, then each flag not defined by absl itself, sorted, spelled with
// dashes as the documentation writes them.
inline std::string HelpText() {
  std::string out = std::string(absl::ProgramUsageMessage()) + "\n\nFlags:\n";
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->Filename().find("absl/flags/") != std::string::npos) continue;
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  for (const absl::CommandLineFlag* flag : flags) {
    std::string name(flag->Name());
    std::replace(name.begin(), name.end(), '_', '-');
    out += "  --" + name +
           " (default: " + (flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue()) +
           ")\n      " + flag->Help() + "\n";
  }
  return out;
}

// Prints HelpText() and exits 0 when the arguments ask for help; call after
// absl::SetProgramUsageMessage and before absl::ParseCommandLine.
inline void ExitOnHelp(int argc, char** argv) {
  if (!AsksForHelp(argc, argv)) return;
  std::fputs(HelpText().c_str(), stdout);
  std::exit(0);
}

}  // namespace riskkv
