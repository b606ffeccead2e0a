#pragma once
// Precompiled header for the library's own translation units (never installed).
#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>
