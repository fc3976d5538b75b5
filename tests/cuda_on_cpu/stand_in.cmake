# The CUDA code on the CPU, wherever the project builds (no CUDA toolkit needed): kernels/cuda and
# optim/cuda compiled as C++ over a stand-in for the CUDA runtime and device (cuda_runtime.h here
# says what it models), each launch rewritten by lower_launches.py. Not the GPU's rounding, memory
# model or speed: tools/gpu-check.sh runs the same code and tests on a GPU (docs/design/gpu.md, "The
# CUDA code on the CPU").
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  return()
endif()

# SOURCE.cu lowered to ${CMAKE_CURRENT_BINARY_DIR}/cuda_on_cpu/NAME.cc, its path appended to OUT_LIST.
function(onebit_lower_for_stand_in cu out_list)
  get_filename_component(name ${cu} NAME_WE)
  set(lowered ${CMAKE_CURRENT_BINARY_DIR}/cuda_on_cpu/${name}.cc)
  add_custom_command(OUTPUT ${lowered}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/lower_launches.py ${PROJECT_SOURCE_DIR}/${cu} ${lowered}
    DEPENDS ${PROJECT_SOURCE_DIR}/${cu} ${CMAKE_CURRENT_LIST_DIR}/lower_launches.py
    COMMENT "lowering ${cu}'s launches for the CUDA stand-in")
  set(${out_list} ${${out_list}} ${lowered} PARENT_SCOPE)
endfunction()

set(onebit_stand_in_sources ${CMAKE_CURRENT_LIST_DIR}/device.cc)
foreach(cu kernels/cuda/cuda_kernels.cu optim/cuda/adam_device.cu optim/cuda/zero_one_adam_device.cu
        optim/cuda/lamb_device.cu optim/cuda/variance_measures.cu)
  onebit_lower_for_stand_in(${cu} onebit_stand_in_sources)
endforeach()
# A header with kernels and launches, lowered under its own path into a folder searched before the
# source tree, so that the lowered sources include the lowered copy.
set(lowered_header ${CMAKE_CURRENT_BINARY_DIR}/cuda_on_cpu/optim/cuda/tiled_sums.h)
add_custom_command(OUTPUT ${lowered_header}
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/lower_launches.py ${PROJECT_SOURCE_DIR}/optim/cuda/tiled_sums.h
          ${lowered_header}
  DEPENDS ${PROJECT_SOURCE_DIR}/optim/cuda/tiled_sums.h ${CMAKE_CURRENT_LIST_DIR}/lower_launches.py
  COMMENT "lowering optim/cuda/tiled_sums.h's launches for the CUDA stand-in")
list(APPEND onebit_stand_in_sources ${lowered_header})
add_library(onebit_cuda_stand_in STATIC ${onebit_stand_in_sources})
# The stand-in's cuda_runtime.h before any CUDA toolkit's; no contraction, as nvcc is told --fmad=false.
target_include_directories(onebit_cuda_stand_in BEFORE PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_include_directories(onebit_cuda_stand_in BEFORE PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/cuda_on_cpu)
target_include_directories(onebit_cuda_stand_in PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
target_compile_options(onebit_cuda_stand_in PUBLIC -ffp-contract=off -fno-math-errno)
target_link_libraries(onebit_cuda_stand_in PUBLIC onebit_core)

# The NCCL door's device path needs NCCL's header; NCCL itself is a stand-in too (ranks as threads).
if(NCCL_INCLUDE_DIR)
  add_library(onebit_nccl_stand_in SHARED ${CMAKE_CURRENT_LIST_DIR}/nccl_stand_in.cc)
  target_include_directories(onebit_nccl_stand_in BEFORE PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  target_include_directories(onebit_nccl_stand_in PRIVATE ${NCCL_INCLUDE_DIR} ${PROJECT_SOURCE_DIR})
  target_link_libraries(onebit_nccl_stand_in PRIVATE Threads::Threads)
  set_target_properties(onebit_nccl_stand_in PROPERTIES CXX_VISIBILITY_PRESET default)  # its pnccl* are found by name
else()
  message(STATUS "onebit: no nccl.h (NCCL_INCLUDE_DIR): the NCCL door's tests on the CUDA stand-in are not built")
endif()

# tools/gpu-check.sh's kernel bench, run end to end on the stand-in so that it works the first time
# on a GPU: every row measured and judged (the stand-in is far below the goal: FAIL is expected).
set(onebit_bench_sources "")
onebit_lower_for_stand_in(tools/cuda-bench/onebit_cuda_bench.cu onebit_bench_sources)
add_executable(onebit-cuda-bench-on-cpu ${onebit_bench_sources})
target_link_libraries(onebit-cuda-bench-on-cpu PRIVATE onebit_cuda_stand_in)
add_test(NAME tools.cuda_bench_on_cpu COMMAND onebit-cuda-bench-on-cpu 1000 4)
set_tests_properties(tools.cuda_bench_on_cpu PROPERTIES TIMEOUT 600
  FAIL_REGULAR_EXPRESSION "Sanitizer|runtime error|cuda_on_cpu:"
  PASS_REGULAR_EXPRESSION "unpack fp16 +[0-9.]+ +[0-9.]+ +[0-9.]+  (pass|FAIL) \\(goal >= 0.8\\)")
