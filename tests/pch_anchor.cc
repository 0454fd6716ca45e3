// SPDX-License-Identifier: Apache-2.0
// kvxfer_test_pch's only source (tests/CMakeLists.txt): the program exists to
// precompile GoogleTest's headers once for every test program; it has no
// tests of its own, and gtest_main runs none.
