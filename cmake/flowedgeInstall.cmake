# Install rules: headers, targets and a relocatable flowedgeConfig.cmake for find_package(flowedge).
include(CMakePackageConfigHelpers)
if(TARGET flowedge_cuda)
  set(FLOWEDGE_HAS_CUDA_VALUE ON)
else()
  set(FLOWEDGE_HAS_CUDA_VALUE OFF)
endif()
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(_flowedge_targets flowedge)
if(TARGET flowedge_cuda)
  list(APPEND _flowedge_targets flowedge_cuda)
endif()
install(TARGETS ${_flowedge_targets} EXPORT flowedgeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT flowedgeTargets NAMESPACE flowedge:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowedge)
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/flowedgeConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/flowedgeConfig.cmake" INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowedge)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/flowedgeConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/flowedgeConfig.cmake" "${PROJECT_BINARY_DIR}/flowedgeConfigVersion.cmake"
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowedge)
