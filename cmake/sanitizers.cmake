# Sanitizer and fuzzing builds, included by the root CMakeLists.txt before any target so that every target (the
# library, the program, the tests, the fuzz targets) is instrumented alike. docs/reliability.md describes both.
#   -DMAMBACPP_SANITIZE=address,undefined   ASan + UBSan with gcc or clang: the CI job in .ci/run runs the suite so
#                                           (a sanitizer report aborts the test: -fno-sanitize-recover)
#   -DMAMBACPP_FUZZ=ON, clang only          libFuzzer coverage plus ASan + UBSan everywhere, and the fuzz/ targets
set(MAMBACPP_SANITIZE "" CACHE STRING "Build with these -fsanitize= checks, e.g. address,undefined (empty: none)")
set(_mambacpp_c_cxx "$<COMPILE_LANGUAGE:C,CXX>")
if(MAMBACPP_SANITIZE)
  add_compile_options("$<${_mambacpp_c_cxx}:-fsanitize=${MAMBACPP_SANITIZE};-fno-sanitize-recover=all;-fno-omit-frame-pointer>")
  add_link_options("-fsanitize=${MAMBACPP_SANITIZE}")
  message(STATUS "mambacpp: sanitizers ${MAMBACPP_SANITIZE}")
endif()
if(MAMBACPP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MAMBACPP_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  add_compile_options(
    "$<${_mambacpp_c_cxx}:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
  add_link_options("-fsanitize=address,undefined")
  # The zip reader skips CRC checks in this mode, so that mutated pickles get past the checksum.
  add_compile_definitions(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION=1)
endif()
