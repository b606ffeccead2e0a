# Fails unless README.md contains examples/readme_usage.cpp verbatim.
#   cmake -DREADME=<README.md> -DEXAMPLE=<readme_usage.cpp> -P check_readme.cmake
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${EXAMPLE} verbatim; copy the file into "
                      "the README's usage section (or the other way round)")
endif()
message(STATUS "README.md shows ${EXAMPLE} verbatim")
