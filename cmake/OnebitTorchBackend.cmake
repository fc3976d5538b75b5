# The native c10d backend (python/onebit/csrc/c10d_backend.cc) built against one torch, beside
# libonebit.so: onebit_c10d.so and onebit_c10d.json (the torch, its revision, the Python and the
# source it was made for). python/onebit/_native.py loads it where all of those match the process,
# so the torch it was built for needs no compiler at run time; any other torch builds it at first use.
#
# ONEBIT_TORCH_PYTHON names a Python whose torch to build it against. The wheel defaults to the
# Python that builds it (scikit-build-core's Python_EXECUTABLE: `pip wheel --no-build-isolation`
# beside the torch the wheel is for); a Python without torch builds none, said once. The CMake path
# builds none unless it is set.
if(ONEBIT_WHEEL)
  set(ONEBIT_TORCH_PYTHON "${Python_EXECUTABLE}" CACHE FILEPATH "Python whose torch the native c10d backend is built against")
else()
  set(ONEBIT_TORCH_PYTHON "" CACHE FILEPATH "Python whose torch the native c10d backend is built against (empty: none)")
endif()
if(NOT ONEBIT_TORCH_PYTHON)
  return()
endif()
execute_process(COMMAND ${ONEBIT_TORCH_PYTHON} -W ignore -c "import torch; print(torch.__version__)"
  RESULT_VARIABLE ONEBIT_NO_TORCH OUTPUT_VARIABLE ONEBIT_TORCH_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(ONEBIT_NO_TORCH)
  message(STATUS "onebit: ${ONEBIT_TORCH_PYTHON} has no torch: no prebuilt c10d backend (built at first use instead)")
  return()
endif()
message(STATUS "onebit: the c10d backend is prebuilt against torch ${ONEBIT_TORCH_VERSION} (${ONEBIT_TORCH_PYTHON})")

set(ONEBIT_C10D_DIR ${PROJECT_BINARY_DIR}/c10d)
set(ONEBIT_C10D_FILES ${ONEBIT_C10D_DIR}/onebit_c10d.so ${ONEBIT_C10D_DIR}/onebit_c10d.json)
add_custom_command(OUTPUT ${ONEBIT_C10D_FILES}
  COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${PROJECT_SOURCE_DIR}/python
          ${ONEBIT_TORCH_PYTHON} -W ignore -c "from onebit import _native; _native.build_into('${ONEBIT_C10D_DIR}')"
  DEPENDS python/onebit/csrc/c10d_backend.cc include/onebit/onebit.h include/onebit/onebit_types.h
          python/onebit/_native.py
  COMMENT "Building the native c10d backend against torch ${ONEBIT_TORCH_VERSION}"
  VERBATIM)
add_custom_target(onebit_c10d ALL DEPENDS ${ONEBIT_C10D_FILES})
if(ONEBIT_WHEEL)
  install(FILES ${ONEBIT_C10D_FILES} DESTINATION onebit/lib)
else()
  # Beside the build tree's libonebit.so, where _native.py looks.
  add_custom_command(TARGET onebit_c10d POST_BUILD
    COMMAND ${CMAKE_COMMAND} -E copy ${ONEBIT_C10D_FILES} $<TARGET_FILE_DIR:onebit> VERBATIM)
endif()
