# Injected via -DCMAKE_PROJECT_INCLUDE=...: runs after every project() call.
# llama-cpp-python's CMakeLists FORCEs LLAMA_BUILD_COMMON=ON before add_subdirectory(vendor/llama.cpp);
# the Python package never loads libllama-common, so switch it back off inside llama.cpp's scope.
if(PROJECT_NAME STREQUAL "llama.cpp")
  set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
  message(STATUS "no_common.cmake: LLAMA_BUILD_COMMON forced OFF")
endif()
