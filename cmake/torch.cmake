# The PyTorch bridge (pytorch/): LibTorch and, for the Python package, the
# interpreter that has torch.
#
# TROUPE_TORCH=AUTO (default) builds the bridge when LibTorch's headers and
# libraries (Debian: libtorch-dev) and pybind11 (pybind11-dev) are found and
# TROUPE_TORCH_PYTHON (default /usr/bin/python3, the interpreter Debian's
# python3-torch belongs to) can `import torch`; ON requires them; OFF skips
# the bridge. It sets TROUPE_HAVE_TORCH, TROUPE_HAVE_TORCH_PYTHON and the
# imported targets troupe_libtorch (torch_cpu, c10) and troupe_torch_python
# (the Python headers, pybind11 and torch_python for the extension module).
#
# Debian's TorchConfig.cmake drags in Caffe2's whole dependency list; the
# bridge needs only the headers and three libraries, so they are found here
# directly.

set(TROUPE_TORCH AUTO CACHE STRING "Build the PyTorch bridge: AUTO, ON or OFF")
set_property(CACHE TROUPE_TORCH PROPERTY STRINGS AUTO ON OFF)
set(TROUPE_TORCH_PYTHON /usr/bin/python3 CACHE FILEPATH
    "The Python interpreter that has torch (not the first python3 on PATH)")
set(TROUPE_HAVE_TORCH OFF)
set(TROUPE_HAVE_TORCH_PYTHON OFF)

function(troupe_torch_missing what)
  if(TROUPE_TORCH STREQUAL "ON")
    message(FATAL_ERROR "TROUPE_TORCH=ON but ${what}")
  endif()
  message(STATUS "troupe: ${what}; building without the PyTorch bridge "
                 "(apt-get install libtorch-dev python3-torch pybind11-dev)")
endfunction()

if(NOT TROUPE_TORCH STREQUAL "OFF")
  find_path(TROUPE_TORCH_INCLUDE_DIR torch/csrc/distributed/c10d/ProcessGroup.hpp)
  find_path(TROUPE_TORCH_API_INCLUDE_DIR torch/nn/module.h
            HINTS ${TROUPE_TORCH_INCLUDE_DIR}/torch/csrc/api/include)
  find_library(TROUPE_TORCH_CPU_LIBRARY torch_cpu)
  find_library(TROUPE_C10_LIBRARY c10)
  find_library(TROUPE_TORCH_PYTHON_LIBRARY torch_python)
  find_path(TROUPE_PYBIND11_INCLUDE_DIR pybind11/pybind11.h)
  if(NOT TROUPE_TORCH_INCLUDE_DIR OR NOT TROUPE_TORCH_API_INCLUDE_DIR
     OR NOT TROUPE_TORCH_CPU_LIBRARY OR NOT TROUPE_C10_LIBRARY)
    troupe_torch_missing("LibTorch (torch_cpu, c10 and the c10d headers) was not found")
  else()
    set(TROUPE_HAVE_TORCH ON)
    add_library(troupe_libtorch INTERFACE)
    target_include_directories(troupe_libtorch SYSTEM INTERFACE
                               ${TROUPE_TORCH_INCLUDE_DIR} ${TROUPE_TORCH_API_INCLUDE_DIR})
    # torch_cpu and c10 after the objects that use them (not torch_python:
    # the C++ part never touches the interpreter).
    target_link_libraries(troupe_libtorch INTERFACE ${TROUPE_TORCH_CPU_LIBRARY}
                                                    ${TROUPE_C10_LIBRARY} Threads::Threads)
    message(STATUS "troupe: PyTorch bridge with LibTorch from ${TROUPE_TORCH_CPU_LIBRARY}")

    # The Python package: the interpreter must import torch, and its
    # headers, pybind11 and torch_python must be there.
    execute_process(
      COMMAND ${TROUPE_TORCH_PYTHON} -c
              "import sys, sysconfig, torch; print(torch.__version__); print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX')); print('python%d.%d' % sys.version_info[:2])"
      RESULT_VARIABLE _troupe_py_rc OUTPUT_VARIABLE _troupe_py_out ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _troupe_py_rc EQUAL 0)
      troupe_torch_missing("${TROUPE_TORCH_PYTHON} cannot import torch")
    elseif(NOT TROUPE_PYBIND11_INCLUDE_DIR OR NOT TROUPE_TORCH_PYTHON_LIBRARY)
      troupe_torch_missing("pybind11 or torch_python was not found")
    else()
      string(REPLACE "\n" ";" _troupe_py_out "${_troupe_py_out}")
      list(GET _troupe_py_out 0 TROUPE_TORCH_VERSION)
      list(GET _troupe_py_out 1 _troupe_py_include)
      list(GET _troupe_py_out 2 TROUPE_PYTHON_EXT_SUFFIX)
      list(GET _troupe_py_out 3 _troupe_py_name)
      if(NOT EXISTS ${_troupe_py_include}/Python.h)
        troupe_torch_missing("Python.h of ${TROUPE_TORCH_PYTHON} was not found (python3-dev)")
      else()
        set(TROUPE_HAVE_TORCH_PYTHON ON)
        add_library(troupe_torch_python INTERFACE)
        target_include_directories(troupe_torch_python SYSTEM INTERFACE
                                   ${_troupe_py_include} ${TROUPE_PYBIND11_INCLUDE_DIR})
        target_link_libraries(troupe_torch_python INTERFACE ${TROUPE_TORCH_PYTHON_LIBRARY}
                                                            troupe_libtorch)
        # Where `cmake --install` puts the package: the interpreter's
        # site directory under the install prefix (Debian: dist-packages).
        set(TROUPE_PYTHON_INSTALL_DIR "lib/${_troupe_py_name}/dist-packages"
            CACHE STRING "Where the troupe_torch package is installed, relative to the prefix")
        message(STATUS "troupe: Python package troupe_torch for ${TROUPE_TORCH_PYTHON} "
                       "(torch ${TROUPE_TORCH_VERSION})")
      endif()
    endif()
  endif()
endif()
