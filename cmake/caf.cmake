# Debian ships CAF without a CMake config: make an imported target by hand.
find_package(Threads REQUIRED)
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
add_library(troupe_caf INTERFACE)
target_include_directories(troupe_caf SYSTEM INTERFACE ${CAF_INCLUDE_DIR})
# Only the core: troupe publishes no actor (CAF's I/O module is not used).
target_link_libraries(troupe_caf INTERFACE ${CAF_CORE_LIBRARY} Threads::Threads)
find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h REQUIRED)
target_include_directories(troupe_caf SYSTEM INTERFACE ${DLPACK_INCLUDE_DIR})
