# System dependencies (Debian 12 / Ubuntu 24.04 packages). Nothing is downloaded at build time.
find_package(Threads REQUIRED)
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(spdlog REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
# ICU: Unicode general categories for GPT-2's pre-tokenizer (letters and numbers).
find_package(ICU REQUIRED COMPONENTS uc)

# BLAS for the CPU reference GEMM: OpenBLAS from the distribution (see third_party/README.md).
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(MEGATRAIN_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
          /usr/include/openblas /usr/include/x86_64-linux-gnu /usr/include/aarch64-linux-gnu/openblas-pthread
          REQUIRED)

# yaml-cpp 0.7 (Debian) exports "yaml-cpp", 0.8 (Ubuntu 24.04) "yaml-cpp::yaml-cpp".
if(TARGET yaml-cpp::yaml-cpp)
  set(MEGATRAIN_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(MEGATRAIN_YAML_TARGET yaml-cpp)
endif()
