# ONEBIT_WITH_<X> = AUTO | ON | OFF. AUTO builds what this machine supports; ON fails the
# configure step with the reason when it is impossible; OFF never builds it. The outcome is
# ONEBIT_HAVE_<X> (TRUE/FALSE) and one summary line.

function(onebit_feature_option name doc)
  set(ONEBIT_WITH_${name} AUTO CACHE STRING "${doc} (AUTO|ON|OFF)")
  set_property(CACHE ONEBIT_WITH_${name} PROPERTY STRINGS AUTO ON OFF)
  if(NOT ONEBIT_WITH_${name} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "ONEBIT_WITH_${name}=${ONEBIT_WITH_${name}}: use AUTO, ON or OFF")
  endif()
endfunction()

# onebit_feature_resolve(NAME <available: TRUE/FALSE> <why not, when not>)
function(onebit_feature_resolve name available why_not)
  set(mode ${ONEBIT_WITH_${name}})
  if(mode STREQUAL "OFF")
    set(have FALSE)
    set(note "off (ONEBIT_WITH_${name}=OFF)")
  elseif(available)
    set(have TRUE)
    set(note "on")
  elseif(mode STREQUAL "ON")
    message(FATAL_ERROR "ONEBIT_WITH_${name}=ON but it cannot be built here: ${why_not}")
  else()
    set(have FALSE)
    set(note "off (AUTO: ${why_not})")
  endif()
  set(ONEBIT_HAVE_${name} ${have} PARENT_SCOPE)
  message(STATUS "onebit: ${name}: ${note}")
endfunction()

onebit_feature_option(CUDA "CUDA kernels (kernels/cuda)")
onebit_feature_option(NCCL "NCCL front doors (ncclAllReduce interposer, NCCL_NET plugin)")
onebit_feature_option(GLOO "Gloo front door (gloo::allreduce interposer) and the Gloo baseline")
onebit_feature_option(IBVERBS "IB verbs transport")

# CUDA: the toolkit in /usr/local/cuda (CUDA 13 here). The top-level CMakeLists enables the
# language and builds kernels/cuda when this resolves on.
set(_cuda_ok FALSE)
set(_cuda_why "no CUDA compiler (nvcc) found; set CMAKE_CUDA_COMPILER or put /usr/local/cuda/bin on PATH")
if(NOT ONEBIT_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_cuda_ok TRUE)
  endif()
endif()
onebit_feature_resolve(CUDA ${_cuda_ok} "${_cuda_why}")

# NCCL: nccl.h and libnccl (the toolkit's copy, or NCCL_HOME as a CMake or environment variable).
# The nvidia-nccl pip wheel (what pip PyTorch loads) ships nvidia/nccl/include/nccl.h and
# lib/libnccl.so.2 only, no unversioned libnccl.so: the versioned name is searched too.
set(_nccl_ok FALSE)
if(NOT ONEBIT_WITH_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_HOME}/include $ENV{NCCL_HOME}/include /usr/local/cuda/include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${NCCL_HOME}/lib $ENV{NCCL_HOME}/lib /usr/local/cuda/lib64 /usr/local/cuda/lib)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(_nccl_ok TRUE)
  endif()
endif()
onebit_feature_resolve(NCCL ${_nccl_ok} "nccl.h or libnccl.so not found (set NCCL_HOME)")

# Gloo: Debian's libgloo-dev CMake package.
set(_gloo_ok FALSE)
if(NOT ONEBIT_WITH_GLOO STREQUAL "OFF")
  find_package(Gloo CONFIG QUIET)
  if(Gloo_FOUND)
    set(_gloo_ok TRUE)
  endif()
endif()
onebit_feature_resolve(GLOO ${_gloo_ok} "Gloo's CMake package not found (apt-get install libgloo-dev)")

# IB verbs: the header of libibverbs-dev. The library itself is loaded at run time
# (transport/ibverbs/verbs_api.cc), so the build needs only verbs.h.
set(_ibverbs_ok FALSE)
if(NOT ONEBIT_WITH_IBVERBS STREQUAL "OFF")
  find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  if(IBVERBS_INCLUDE_DIR)
    set(_ibverbs_ok TRUE)
  endif()
endif()
onebit_feature_resolve(IBVERBS ${_ibverbs_ok} "infiniband/verbs.h not found (apt-get install libibverbs-dev)")

# CPU kernel sets the compiler can build (the CPU is asked at run time).
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag("-mavx2 -mfma -mf16c" ONEBIT_COMPILER_AVX2)
check_cxx_compiler_flag("-mavx512f -mavx512bw -mavx512vl -mavx512dq" ONEBIT_COMPILER_AVX512)
