// Internal to the engine library: the live Context that every C API call
// reaches (one per process, whatever bindings are loaded).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/context.h"

namespace kerasdist {

// The current Context, or null before init() / after shutdown().
std::shared_ptr<Context> CurrentContext();

// Copies `message` into buf (len bytes, always terminated).
void CopyMessage(const std::string& message, char* buf, int32_t len);

}  // namespace kerasdist
