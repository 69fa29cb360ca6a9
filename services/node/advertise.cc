#include "services/node/advertise.h"

#include <unistd.h>

#include <climits>

namespace riskkv {

std::string DefaultAdvertise(std::string_view listen, int port, std::string_view hostname) {
  const size_t colon = listen.rfind(':');
  std::string_view host = colon == std::string_view::npos ? listen : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "[::0]") {
    host = hostname.empty() ? std::string_view("localhost") : hostname;
  }
  return std::string(host) + ":" + std::to_string(port);
}

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace riskkv
