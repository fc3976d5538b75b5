# The GoogleTest suites (tests/CMakeLists.txt includes this unless ONEBIT_TESTS_WITHOUT_GTEST).
# GoogleTest: the installed one (Debian's libgtest-dev), else a source tree built here — for
# machines where nothing can be installed (tools/gpu-check.sh on a bare GPU machine).
set(ONEBIT_GTEST_SOURCE_DIR "" CACHE PATH "GoogleTest source tree to build when no installed GoogleTest is found")
find_package(GTest QUIET)
if(NOT GTest_FOUND)
  if(NOT ONEBIT_GTEST_SOURCE_DIR)
    message(FATAL_ERROR "GoogleTest not found: apt-get install libgtest-dev, or configure with "
                        "-DONEBIT_GTEST_SOURCE_DIR=<a googletest source tree> (or -DONEBIT_TESTS_WITHOUT_GTEST=ON, or "
                        "-DONEBIT_BUILD_TESTS=OFF)")
  endif()
  if(NOT EXISTS ${ONEBIT_GTEST_SOURCE_DIR}/CMakeLists.txt)
    message(FATAL_ERROR "ONEBIT_GTEST_SOURCE_DIR=${ONEBIT_GTEST_SOURCE_DIR} holds no CMakeLists.txt (a googletest checkout, "
                        "or /usr/src/googletest from libgtest-dev)")
  endif()
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory(${ONEBIT_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
  foreach(lib gtest gtest_main)
    if(NOT TARGET GTest::${lib})
      add_library(GTest::${lib} ALIAS ${lib})
    endif()
  endforeach()
  message(STATUS "onebit: GoogleTest built from ${ONEBIT_GTEST_SOURCE_DIR}")
endif()
include(GoogleTest)

# Unit tests link onebit_core, the library the shipped .so is made of.
add_executable(onebit_unit_tests
  unit/kernels_test.cc
  unit/half_test.cc
  unit/params_test.cc
  unit/bench_options_test.cc
  unit/wire_test.cc
  unit/bootstrap_test.cc
  unit/optim_test.cc
  unit/adam_driver_test.cc
  unit/checkpoint_file_test.cc
  unit/socket_test.cc
  unit/tag_state_test.cc
  unit/communicator_table_test.cc
  $<TARGET_OBJECTS:onebit_capi>
  $<TARGET_OBJECTS:onebit_device_steps_absent>
)
if(ONEBIT_HAVE_IBVERBS)
  target_sources(onebit_unit_tests PRIVATE unit/ibverbs_test.cc)
  # The verbs transport on a device (skipping with the reason where there is none) and on the
  # in-process stand-in adapter (tests/ibverbs/fake_verbs.h), which runs everywhere. The
  # engine picks its transport from ONEBIT_TRANSPORT, read once per process: set for the binary.
  add_executable(onebit_ibverbs_tests ibverbs/ibverbs_device_test.cc ibverbs/fake_verbs.cc)
  target_link_libraries(onebit_ibverbs_tests PRIVATE onebit_core GTest::gtest GTest::gtest_main)
  gtest_discover_tests(onebit_ibverbs_tests DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT 300 ENVIRONMENT "ONEBIT_TRANSPORT=ibverbs")
endif()
target_link_libraries(onebit_unit_tests PRIVATE onebit_core onebit_bench_options GTest::gtest GTest::gtest_main)
gtest_discover_tests(onebit_unit_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)

# The engine through the shipped C ABI, ranks as processes on loopback.
add_executable(onebit_engine_tests engine/compressed_allreduce_test.cc engine/ring_allreduce_test.cc engine/failures_test.cc
               engine/access_test.cc engine/onebit_adam_test.cc engine/optimizers_test.cc)
target_link_libraries(onebit_engine_tests PRIVATE onebit GTest::gtest GTest::gtest_main)
target_include_directories(onebit_engine_tests PRIVATE ${PROJECT_SOURCE_DIR})

gtest_discover_tests(onebit_engine_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
# Who is in a communicator: ranks through the C API, strangers written with the wire records.
add_executable(onebit_membership_tests engine/membership_test.cc $<TARGET_OBJECTS:onebit_capi>)
target_link_libraries(onebit_membership_tests PRIVATE onebit_core GTest::gtest GTest::gtest_main)
target_include_directories(onebit_membership_tests PRIVATE ${PROJECT_SOURCE_DIR})
gtest_discover_tests(onebit_membership_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
# The transport contract (transport/transport.h), clause by clause, on every backend this build has:
# tcp, the verbs transport on its in-process stand-in adapter, and gloo over a real gloo::Context
# (its first C++ test). Ranks are threads on loopback sockets.
add_executable(onebit_transport_conformance_tests engine/transport_conformance_test.cc)
target_link_libraries(onebit_transport_conformance_tests PRIVATE onebit_core GTest::gtest GTest::gtest_main)
target_include_directories(onebit_transport_conformance_tests PRIVATE ${PROJECT_SOURCE_DIR})
if(ONEBIT_HAVE_IBVERBS)
  target_sources(onebit_transport_conformance_tests PRIVATE ibverbs/fake_verbs.cc)
endif()
if(ONEBIT_HAVE_GLOO)
  target_sources(onebit_transport_conformance_tests PRIVATE $<TARGET_OBJECTS:onebit_gloo_transport>)
  target_compile_definitions(onebit_transport_conformance_tests PRIVATE ONEBIT_HAVE_GLOO)
  # Linked here, unlike in the Gloo door: the test makes its own contexts, and libgloo.h finds
  # its functions in the libgloo.so.0 the process has loaded (this one).
  target_link_libraries(onebit_transport_conformance_tests PRIVATE gloo)
endif()
gtest_discover_tests(onebit_transport_conformance_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
add_executable(onebit_hierarchical_tests engine/hierarchical_test.cc)
target_link_libraries(onebit_hierarchical_tests PRIVATE onebit GTest::gtest GTest::gtest_main)
target_include_directories(onebit_hierarchical_tests PRIVATE ${PROJECT_SOURCE_DIR})
gtest_discover_tests(onebit_hierarchical_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)

# CUDA kernels against the scalar CPU kernel; skipped (with a message) where no GPU is present.
if(ONEBIT_HAVE_CUDA)
  add_executable(onebit_cuda_tests cuda/cuda_kernels_test.cc cuda/optimizer_device_test.cc
    ${PROJECT_SOURCE_DIR}/plugin/capi/device_steps.cc $<TARGET_OBJECTS:onebit_capi>)
  target_link_libraries(onebit_cuda_tests PRIVATE onebit_cuda_kernels onebit_cuda_optim onebit_core CUDA::cudart
    GTest::gtest GTest::gtest_main)
  gtest_discover_tests(onebit_cuda_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endif()

# The same CUDA tests on the CPU, over the CUDA stand-in (cuda_on_cpu/stand_in.cmake): the kernels'
# indexing, sums and votes and the tests' own expectations, checked before a GPU runs them.
if(TARGET onebit_cuda_stand_in)
  add_executable(onebit_cuda_on_cpu_tests cuda/cuda_kernels_test.cc cuda/optimizer_device_test.cc
    cuda_on_cpu/stand_in_test.cc ${PROJECT_SOURCE_DIR}/plugin/capi/device_steps.cc $<TARGET_OBJECTS:onebit_capi>)
  target_include_directories(onebit_cuda_on_cpu_tests PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(onebit_cuda_on_cpu_tests PRIVATE onebit_cuda_stand_in onebit_core GTest::gtest
    GTest::gtest_main)
  if(TARGET onebit_nccl_stand_in)  # the NCCL door and its device path, ranks as threads
    target_sources(onebit_cuda_on_cpu_tests PRIVATE cuda_on_cpu/cuda_allreduce_test.cc cuda_on_cpu/nccl_door_test.cc
      cuda_on_cpu/nccl_stand_in_test.cc
      ${PROJECT_SOURCE_DIR}/plugin/preload/nccl_interposer.cc ${PROJECT_SOURCE_DIR}/engine/cuda_allreduce.cc
      ${PROJECT_SOURCE_DIR}/transport/nccl/nccl_api.cc ${PROJECT_SOURCE_DIR}/transport/nccl/nccl_exchange.cc)
    target_include_directories(onebit_cuda_on_cpu_tests BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/cuda_on_cpu)
    target_include_directories(onebit_cuda_on_cpu_tests PRIVATE ${NCCL_INCLUDE_DIR})  # after the stand-in's
    target_link_libraries(onebit_cuda_on_cpu_tests PRIVATE onebit_nccl_stand_in ${CMAKE_DL_LIBS})
  endif()
  gtest_discover_tests(onebit_cuda_on_cpu_tests TEST_PREFIX "on_cpu." DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endif()

# libnccl-net-onebit.so through its ABI (dlopen), two processes as NCCL's proxy would drive it.
add_executable(onebit_nccl_net_tests nccl_net/net_plugin_test.cc)
# onebit_core only to craft handshakes the way a peer would (the plugin itself is dlopen'd).
target_link_libraries(onebit_nccl_net_tests PRIVATE onebit_core GTest::gtest GTest::gtest_main ${CMAKE_DL_LIBS})
target_include_directories(onebit_nccl_net_tests PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(onebit_nccl_net_tests PRIVATE ONEBIT_NCCL_NET_PLUGIN="$<TARGET_FILE:nccl-net-onebit>")
add_dependencies(onebit_nccl_net_tests nccl-net-onebit)
gtest_discover_tests(onebit_nccl_net_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
