# Finds the C++ Actor Framework 0.17 as Debian ships it (headers + shared
# libraries, no CMake package config) and wraps it in imported targets:
#   CAF::core  -> libcaf_core
#   CAF::io    -> libcaf_io (middleman, remote actors)
# CAF_ROOT (cache or environment) points at an unpacked prefix, e.g. the
# Debian packages extracted by scripts/gpu-run.sh on a machine without apt.
set(_caf_hints ${CAF_ROOT} $ENV{CAF_ROOT})
find_path(CAF_INCLUDE_DIR caf/all.hpp
          HINTS ${_caf_hints} PATH_SUFFIXES include usr/include)
find_library(CAF_CORE_LIBRARY caf_core
             HINTS ${_caf_hints} PATH_SUFFIXES lib lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu)
find_library(CAF_IO_LIBRARY caf_io
             HINTS ${_caf_hints} PATH_SUFFIXES lib lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY)
if(CAF_FOUND AND NOT TARGET CAF::core)
  add_library(CAF::core SHARED IMPORTED)
  set_target_properties(CAF::core PROPERTIES
    IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
  add_library(CAF::io SHARED IMPORTED)
  set_target_properties(CAF::io PROPERTIES
    IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES CAF::core)
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY)
