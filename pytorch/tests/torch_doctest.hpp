#pragma once
// doctest after LibTorch: torch's logging (glog) defines CHECK, CHECK_EQ, ...
// which doctest needs for its own assertions. Include this instead of
// <doctest/doctest.h> in the torch suites, after the torch headers.

#include <c10/util/Logging.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LE
#undef CHECK_LT
#undef CHECK_GE
#undef CHECK_GT
#undef CHECK_NOTNULL

#include <doctest/doctest.h>
