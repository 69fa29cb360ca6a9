// The address a node advertises (riskkv_node_info, its log line) when --advertise is not given.
#pragma once

#include <string>
#include <string_view>

namespace riskkv {

// --listen's host with the port the server got; when --listen names every interface ("0.0.0.0",
// "[::]", "::" or no host), `hostname` instead, since a wildcard is no address anyone can reach.
std::string DefaultAdvertise(std::string_view listen, int port, std::string_view hostname);

// This machine's host name (a container's is its name on the compose network or its id).
std::string HostName();

}  // namespace riskkv
