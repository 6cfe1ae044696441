// catch_main.cpp: the test runner's main() for either Catch2 major version.
#if defined(MEGATRAIN_CATCH3)
#include <catch2/catch_session.hpp>
int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
#else
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif
