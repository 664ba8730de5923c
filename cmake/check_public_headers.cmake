cmake_minimum_required(VERSION 3.25)
# cmake -DSOURCE_DIR=<repo> -P check_public_headers.cmake
# Fails when an installed public header (public_headers.cmake) is missing or
# includes a project header ("dir/file.hpp") that is not installed: such a
# header would compile in this tree and break every project that uses the
# installed package.
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<repository root> -P check_public_headers.cmake")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/public_headers.cmake)
set(problems)
foreach(header IN LISTS ACTORGRAPH_PUBLIC_HEADERS)
  if(NOT EXISTS ${SOURCE_DIR}/${header})
    list(APPEND problems "${header}: listed in cmake/public_headers.cmake but does not exist")
    continue()
  endif()
  file(STRINGS ${SOURCE_DIR}/${header} includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*" "\\1" included "${line}")
    if(NOT included IN_LIST ACTORGRAPH_PUBLIC_HEADERS)
      list(APPEND problems "${header} includes \"${included}\", which is not a public header "
                           "(add it to cmake/public_headers.cmake, or do not include it there)")
    endif()
  endforeach()
endforeach()
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "public headers that would not compile installed:\n  ${text}")
endif()
list(LENGTH ACTORGRAPH_PUBLIC_HEADERS n)
message(STATUS "the ${n} public headers include only each other")
