// catch.h: one include for Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04).
#pragma once
#if defined(MEGATRAIN_CATCH3)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
using Catch::Approx;
#define MT_CONTAINS(text) Catch::Matchers::ContainsSubstring(text)
#else
#include <catch2/catch.hpp>
#define MT_CONTAINS(text) Catch::Matchers::Contains(text)
#endif
