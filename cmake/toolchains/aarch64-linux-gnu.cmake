# Cross-compiles flowedge for 64-bit ARM Linux with Debian's g++-aarch64-linux-gnu (CI runs the result under
# qemu-user: tools/test_aarch64.sh). Target libraries (libstdc++, libgomp, glibc) come from /usr/aarch64-linux-gnu.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# The header-only dependencies (Eigen, nlohmann_json, doctest, CLI11) are the host's packages, seen through a folder
# that holds only them: adding the host's /usr/include itself to the include path would put x86 glibc headers ahead
# of the target's. The dependency lookup's `find_path(... PATHS /usr/include)` is re-rooted into that folder.
set(_flowedge_host_headers "${CMAKE_BINARY_DIR}/host-headers")
foreach(_dep eigen3 nlohmann doctest CLI)
  if(EXISTS "/usr/include/${_dep}" AND NOT EXISTS "${_flowedge_host_headers}/usr/include/${_dep}")
    file(MAKE_DIRECTORY "${_flowedge_host_headers}/usr/include")
    file(CREATE_LINK "/usr/include/${_dep}" "${_flowedge_host_headers}/usr/include/${_dep}" SYMBOLIC)
  endif()
endforeach()

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu "${_flowedge_host_headers}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest and add_custom_command run the target's programs through user-mode emulation (no binfmt registration needed).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
