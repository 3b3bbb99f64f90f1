// The one place that holds the live kerasdist Context, shared by the C API
// (init/shutdown from Python through ctypes) and the op kernels.
#pragma once

#include <memory>

#include "../core/context.h"

namespace kerasdist {

// The current Context, or null before init() / after shutdown().
std::shared_ptr<Context> CurrentContext();

}  // namespace kerasdist
