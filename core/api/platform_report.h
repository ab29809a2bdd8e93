// The platform as the public API reports it (moelite_platform_get / _describe_json): the OS
// layer's facts (platforms/system_info.h) plus what only core knows, the backends built in and
// what AUTO picks (backends/backend_registry.cpp decides; this only reports).
#pragma once
#include <string>

namespace moelite {

// One JSON object, the layout documented at moelite_platform_describe_json in include/moelite.h.
std::string platform_json();

}  // namespace moelite
