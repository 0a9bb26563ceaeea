# Read by CMake at the end of llama.cpp's project() while pip builds llama-cpp-python from source
# (the README's install passes it in CMAKE_ARGS as CMAKE_PROJECT_llama.cpp_INCLUDE): build only
# the libraries llama-cpp-python loads (ggml, llama, mtmd). llama-cpp-python turns llama.cpp's
# common library on (in its cache, forced, so a -D cannot turn it off); the package never loads
# it, and it was 40% of the build's CPU time (its chat and argument parsers, and cpp-httplib:
# 57 of 193 build steps; 12.5 against 20.9 CPU-minutes for llama-cpp-python 0.3.36 on x86-64).
# A normal variable of this scope overrides the cache entry where llama.cpp reads it.
set(LLAMA_BUILD_COMMON OFF)
