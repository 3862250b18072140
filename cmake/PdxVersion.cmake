# pdx's version and ABI version, read from Cargo.toml (the one source of the
# version), plus the system libraries a static libpdx.a needs.
#
#   PDX_VERSION          MAJOR.MINOR.PATCH of the [package] section
#   PDX_ABI_VERSION      what the SONAME carries (libpdx.so.<abi>): the major
#                        version from 1.0 on, "0.MINOR" while the version is
#                        0.x (Cargo's rule: every 0.x minor may break).
#                        build.rs computes the same name for the linker.
#   PDX_NATIVE_STATIC_LIBS  what `rustc --print native-static-libs` reports
#                        for libpdx.a on Linux (std's needs; pdx adds none)
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../Cargo.toml" _pdx_version_line
  REGEX "^version = \"[0-9]+\\.[0-9]+\\.[0-9]+\"" LIMIT_COUNT 1)
if(NOT _pdx_version_line MATCHES "\"([0-9]+)\\.([0-9]+)\\.([0-9]+)\"")
  message(FATAL_ERROR "cannot read pdx's version from Cargo.toml")
endif()
set(PDX_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")
if(CMAKE_MATCH_1 STREQUAL "0")
  set(PDX_ABI_VERSION "0.${CMAKE_MATCH_2}")
  set(PDX_VERSION_COMPATIBILITY SameMinorVersion)
else()
  set(PDX_ABI_VERSION "${CMAKE_MATCH_1}")
  set(PDX_VERSION_COMPATIBILITY SameMajorVersion)
endif()
set(PDX_NATIVE_STATIC_LIBS dl gcc_s util rt pthread m dl c)
unset(_pdx_version_line)
