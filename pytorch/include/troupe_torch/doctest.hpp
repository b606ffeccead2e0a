#pragma once
/// doctest in a LibTorch program: torch's logging (glog's macros) defines
/// CHECK, CHECK_EQ, ... which doctest needs for its own assertions. Include
/// <troupe_torch/doctest.hpp> instead of <doctest/doctest.h>, after the
/// torch headers; torch's CHECK macros are then doctest's.
///
///   #include <torch/torch.h>
///   #include <troupe_torch/doctest.hpp>
///
///   TEST_CASE("allreduce of a torch tensor") { ... CHECK(...); }

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
