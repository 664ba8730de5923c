# Install rules (included from the top-level CMakeLists.txt when
# ACTORGRAPH_INSTALL is ON, the default for a top-level build):
#   <prefix>/include/actorgraph/<path>   the public headers (public_headers.cmake)
#   <prefix>/lib/libag_*.a               the static libraries
#   <prefix>/bin/actorgraph              the REPL
#   <prefix>/lib/cmake/actorgraph/       actorgraphConfig.cmake, its version file,
#                                        the exported targets, FindCAF.cmake
# A project then writes find_package(actorgraph) and links
# actorgraph::actorgraph; its sources include the headers as this tree does
# ("actors/actorgraph.hpp"): the target's include directory is
# <prefix>/include/actorgraph.
include(CMakePackageConfigHelpers)
include(${CMAKE_CURRENT_LIST_DIR}/public_headers.cmake)

set(ACTORGRAPH_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/actorgraph)

foreach(header IN LISTS ACTORGRAPH_PUBLIC_HEADERS)
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/actorgraph/${dir} COMPONENT actorgraph)
endforeach()

set(ACTORGRAPH_EXPORTED_TARGETS
  actorgraph_options ag_graph ag_host_memory ag_collective_path ag_gpu ag_messages ag_actors ag_actorgraph)
if(ACTORGRAPH_HAVE_CUDA)
  list(APPEND ACTORGRAPH_EXPORTED_TARGETS ag_gpu_cuda)
endif()
install(TARGETS ${ACTORGRAPH_EXPORTED_TARGETS}
        EXPORT actorgraphTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT actorgraph
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT actorgraph)
install(EXPORT actorgraphTargets
        NAMESPACE actorgraph::
        DESTINATION ${ACTORGRAPH_INSTALL_CMAKEDIR} COMPONENT actorgraph)

# What the config file must find again in the user's project (the static
# libraries' link dependencies), as this build found it.
set(ACTORGRAPH_CONFIG_HAVE_CUDA ${ACTORGRAPH_HAVE_CUDA})
set(ACTORGRAPH_CONFIG_HAVE_BLAS ${BLAS_FOUND})
set(ACTORGRAPH_CONFIG_HAVE_DNNL ${ACTORGRAPH_HAVE_DNNL})
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/actorgraphConfig.cmake.in
  ${PROJECT_BINARY_DIR}/actorgraphConfig.cmake
  INSTALL_DESTINATION ${ACTORGRAPH_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same minor is compatible.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/actorgraphConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
          ${PROJECT_BINARY_DIR}/actorgraphConfig.cmake
          ${PROJECT_BINARY_DIR}/actorgraphConfigVersion.cmake
          ${CMAKE_CURRENT_LIST_DIR}/FindCAF.cmake
        DESTINATION ${ACTORGRAPH_INSTALL_CMAKEDIR} COMPONENT actorgraph)
