# Finds flowedge's header-only dependencies: Eigen 3.4 and nlohmann_json (system packages, or a
# FLOWEDGE_DEPS_DIR holding their headers for machines without the packages, e.g. the GPU box).
include(GNUInstallDirs)
set(FLOWEDGE_DEPS_DIR "${CMAKE_CURRENT_LIST_DIR}/../.deps" CACHE PATH "Fallback folder with vendored dependency headers")

find_package(Eigen3 3.4 QUIET NO_MODULE)
if(NOT TARGET Eigen3::Eigen)
  find_path(FLOWEDGE_EIGEN_INCLUDE Eigen/Core PATHS /usr/include/eigen3 /usr/local/include/eigen3 ${FLOWEDGE_DEPS_DIR}/eigen3)
  if(NOT FLOWEDGE_EIGEN_INCLUDE)
    message(FATAL_ERROR "flowedge: Eigen 3.4 not found: install libeigen3-dev (Debian/Ubuntu) or set Eigen3_DIR")
  endif()
  add_library(Eigen3::Eigen INTERFACE IMPORTED)
  set_target_properties(Eigen3::Eigen PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${FLOWEDGE_EIGEN_INCLUDE}")
endif()

find_package(nlohmann_json 3.10 QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_path(FLOWEDGE_JSON_INCLUDE nlohmann/json.hpp PATHS ${FLOWEDGE_DEPS_DIR} /usr/include /usr/local/include)
  if(NOT FLOWEDGE_JSON_INCLUDE)
    message(FATAL_ERROR "flowedge: nlohmann_json not found: install nlohmann-json3-dev (Debian/Ubuntu) or set nlohmann_json_DIR")
  endif()
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${FLOWEDGE_JSON_INCLUDE}")
endif()
