# System dependencies (Debian 12 / Ubuntu 24.04 packages). Nothing is downloaded at build time.
find_package(Threads REQUIRED)
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(spdlog REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
# ICU: Unicode general categories for GPT-2's pre-tokenizer (letters and numbers). Without it the
# build works but GPT2BPETokenizer refuses to run (saying to install libicu-dev).
find_package(ICU COMPONENTS uc OPTIONAL_COMPONENTS i18n)  # i18n: regular expressions (HuggingFaceTokenizer)
# SentencePiece (libsentencepiece-dev) for SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer.
# Without it the build works and those tokenizers refuse to run (saying to install it).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(SENTENCEPIECE QUIET IMPORTED_TARGET sentencepiece)
endif()

# BLAS for the CPU reference GEMM: OpenBLAS from the distribution (see third_party/README.md). Without
# it a plain blocked GEMM is compiled instead (correct, slower).
set(BLA_VENDOR OpenBLAS)
find_package(BLAS)
find_path(MEGATRAIN_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
          /usr/include/openblas /usr/include/x86_64-linux-gnu /usr/include/aarch64-linux-gnu/openblas-pthread)
if(BLAS_FOUND AND MEGATRAIN_CBLAS_INCLUDE)
  set(MEGATRAIN_HAVE_CBLAS ON)
else()
  set(MEGATRAIN_HAVE_CBLAS OFF)
  message(WARNING "megatrain: OpenBLAS not found (apt-get install libopenblas-dev): the CPU engine uses its own slower GEMM")
endif()

# yaml-cpp 0.7 (Debian) exports "yaml-cpp", 0.8 (Ubuntu 24.04) "yaml-cpp::yaml-cpp".
if(TARGET yaml-cpp::yaml-cpp)
  set(MEGATRAIN_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(MEGATRAIN_YAML_TARGET yaml-cpp)
endif()
