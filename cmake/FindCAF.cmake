# FindCAF: the C++ Actor Framework 0.17 as Debian ships it (headers + shared
# libraries, no CMake package config), wrapped in imported targets:
#   CAF::core  -> libcaf_core
#   CAF::io    -> libcaf_io (middleman, remote actors)
# Sets CAF_FOUND, CAF_VERSION (from caf/config.hpp), CAF_INCLUDE_DIR,
# CAF_CORE_LIBRARY, CAF_IO_LIBRARY.
#
# Where it looks: CMake's standard search (CMAKE_PREFIX_PATH, the system
# prefixes, lib/<CMAKE_LIBRARY_ARCHITECTURE> under each), and first CAF_ROOT
# (cache variable or environment): a prefix such as /opt/caf, or the root of
# Debian packages unpacked with `dpkg -x` (scripts/gpu-run.sh), whose files
# lie under <root>/usr. Installed next to actorgraphConfig.cmake, which finds
# CAF through it for projects that use the installed actorgraph.
set(_caf_roots)
foreach(_caf_root IN ITEMS "${CAF_ROOT}" "$ENV{CAF_ROOT}")
  if(_caf_root)
    list(APPEND _caf_roots "${_caf_root}" "${_caf_root}/usr")
  endif()
endforeach()
set(_caf_lib_suffixes lib)
if(CMAKE_LIBRARY_ARCHITECTURE)
  list(PREPEND _caf_lib_suffixes "lib/${CMAKE_LIBRARY_ARCHITECTURE}")
endif()

find_path(CAF_INCLUDE_DIR caf/all.hpp HINTS ${_caf_roots} PATH_SUFFIXES include)
find_library(CAF_CORE_LIBRARY caf_core HINTS ${_caf_roots} PATH_SUFFIXES ${_caf_lib_suffixes})
find_library(CAF_IO_LIBRARY caf_io HINTS ${_caf_roots} PATH_SUFFIXES ${_caf_lib_suffixes})

if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_version_line REGEX "^#define CAF_VERSION [0-9]+")
  if(_caf_version_line MATCHES "CAF_VERSION ([0-9]+)")
    # CAF_VERSION is major * 10000 + minor * 100 + patch (1706 = 0.17.6).
    math(EXPR _caf_major "${CMAKE_MATCH_1} / 10000")
    math(EXPR _caf_minor "${CMAKE_MATCH_1} / 100 % 100")
    math(EXPR _caf_patch "${CMAKE_MATCH_1} % 100")
    set(CAF_VERSION "${_caf_major}.${_caf_minor}.${_caf_patch}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY
  VERSION_VAR CAF_VERSION)

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
unset(_caf_roots)
unset(_caf_root)
unset(_caf_lib_suffixes)
unset(_caf_version_line)
