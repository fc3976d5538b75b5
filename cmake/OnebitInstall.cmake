# What `cmake --install` and the Python wheel ship.
#
# The CMake path (a prefix such as /usr/local): every library built (libonebit.so with its SONAME
# triplet, libnccl-net-onebit.so, libonebit-nccl-preload.so and libonebit-preload.so when built),
# onebit-info, the headers, onebitConfig.cmake (find_package(onebit) -> onebit::onebit) and onebit.pc.
#
# The wheel (ONEBIT_WHEEL, run by scikit-build-core with the install prefix at site-packages): the
# libraries only, one file each, into onebit/lib next to the Python package, where onebit.lib_dir()
# looks. libonebit-preload.so never goes there: it interposes the system libgloo.so.0 that Debian's
# torch links, and a pip torch bundles its own gloo, which it cannot reach (docs/design/doors.md, "PyTorch from PyPI").

set(ONEBIT_SHIPPED_LIBRARIES onebit nccl-net-onebit)
if(TARGET onebit-nccl-preload)
  list(APPEND ONEBIT_SHIPPED_LIBRARIES onebit-nccl-preload)
endif()

if(ONEBIT_WHEEL)
  install(TARGETS ${ONEBIT_SHIPPED_LIBRARIES} LIBRARY DESTINATION onebit/lib)
  return()
endif()

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(TARGET onebit-preload)
  list(APPEND ONEBIT_SHIPPED_LIBRARIES onebit-preload)
endif()
list(REMOVE_ITEM ONEBIT_SHIPPED_LIBRARIES onebit)
install(TARGETS onebit EXPORT onebitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The front doors are loaded by path (LD_PRELOAD, NCCL_NET_PLUGIN), never linked: no export.
install(TARGETS ${ONEBIT_SHIPPED_LIBRARIES} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS onebit-info RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/onebit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(ONEBIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/onebit)
install(EXPORT onebitTargets NAMESPACE onebit:: DESTINATION ${ONEBIT_CMAKE_DIR})
configure_package_config_file(cmake/onebitConfig.cmake.in ${PROJECT_BINARY_DIR}/onebitConfig.cmake
  INSTALL_DESTINATION ${ONEBIT_CMAKE_DIR})
# The C ABI only grows within a major version (onebit_version() says which minor a library is).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/onebitConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/onebitConfig.cmake ${PROJECT_BINARY_DIR}/onebitConfigVersion.cmake
  DESTINATION ${ONEBIT_CMAKE_DIR})

# onebit.pc finds its prefix from its own place (${pcfiledir}), so it stays right when the tree is
# installed with `cmake --install --prefix` somewhere else than CMAKE_INSTALL_PREFIX, or moved.
file(RELATIVE_PATH ONEBIT_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" ONEBIT_PC_TO_PREFIX "${ONEBIT_PC_TO_PREFIX}")
configure_file(cmake/onebit.pc.in ${PROJECT_BINARY_DIR}/onebit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/onebit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
