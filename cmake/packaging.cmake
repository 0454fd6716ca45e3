# SPDX-License-Identifier: Apache-2.0
# Debian packages, one per install component, built by `make package`
# (CPack's DEB generator from a tree configured with -DCMAKE_INSTALL_PREFIX=/usr,
# so that GNUInstallDirs picks /usr/lib/<triplet> and python/CMakeLists.txt
# /usr/lib/python3/dist-packages):
#   libkvxferN      runtime  libkvxfer.so.N (N = the SOVERSION)
#   libkvxfer-dev   dev      headers, libkvxfer.so, the find_package(kvxfer) files
#   python3-kvxfer  python   the kvxfer Python package
#   kvxfer          tool     the kvxfer command
# Dependencies on Debian's libraries (libucx0, libssl3, libspdlog...) come
# from dpkg-shlibdeps; between our packages from the component graph, always
# on the exact version (they are built together from one tree).

set(KVXFER_DEB_MAINTAINER "kvxfer maintainers <maintainers@users.noreply.a-seed-7485e74b.example>")
set(KVXFER_DEB_RELEASE 1)
set(KVXFER_DEB_VERSION ${PROJECT_VERSION}-${KVXFER_DEB_RELEASE})
set(_kvxfer_runtime_pkg libkvxfer${PROJECT_VERSION_MAJOR})

# Every Debian package carries /usr/share/doc/<package>/copyright and
# changelog.Debian.gz (Debian policy 12.5, 12.7; lintian checks both). They
# are EXCLUDE_FROM_ALL: CPack installs them component by component, but a
# plain `cmake --install` (make install) leaves them out.
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/changelog.in
  ${CMAKE_CURRENT_BINARY_DIR}/debian/changelog.Debian @ONLY)
# gzip -9n: maximum compression and no timestamp, as lintian wants.
execute_process(COMMAND gzip -9n -c ${CMAKE_CURRENT_BINARY_DIR}/debian/changelog.Debian
  OUTPUT_FILE ${CMAKE_CURRENT_BINARY_DIR}/debian/changelog.Debian.gz
  COMMAND_ERROR_IS_FATAL ANY)
foreach(pair runtime:${_kvxfer_runtime_pkg} dev:libkvxfer-dev python:python3-kvxfer tool:kvxfer)
  string(REPLACE ":" ";" pair ${pair})
  list(GET pair 0 component)
  list(GET pair 1 package)
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/copyright
    ${CMAKE_CURRENT_BINARY_DIR}/debian/changelog.Debian.gz
    DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package}
    PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
    COMPONENT ${component} EXCLUDE_FROM_ALL)
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvxfer)
set(CPACK_PACKAGE_VENDOR "kvxfer")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT ${KVXFER_DEB_MAINTAINER})
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)  # lintian: no unstripped binaries in a package
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev python tool)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # <name>_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE ${KVXFER_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${KVXFER_DEB_MAINTAINER})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps must find libkvxfer.so.N (needed by the tool and the
# extension) in this build tree; it belongs to no installed package, which
# --ignore-missing-info (CPack passes it) tolerates: the component graph below
# adds that dependency instead.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR})
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ${_kvxfer_runtime_pkg})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
# The shlibs file lets other packages' dpkg-shlibdeps map libkvxfer.so.N to
# this package; CPack also adds the ldconfig calls a shared library needs.
# (Global: CPack has no per-component switch; it skips files without a
# SONAME, such as the Python extension, with an author warning.)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
# "=" (exact version): while the major version is 0 the SOVERSION does not
# change with the ABI, so a dependent package is only safe with the build
# it was made against.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
# Debian runs ldconfig through a dpkg trigger (lintian: lacks-ldconfig-trigger
# is an error). CPack 3.25 also writes postinst/postrm calling ldconfig,
# which lintian only warns about (maintscript-calls-ldconfig).
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/debian/triggers "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_BINARY_DIR}/debian/triggers)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libkvxfer-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-kvxfer)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
# The extension is built for one Python minor version (its file name says
# cpython-3XY); numpy is what callers hand it (pools, index arrays).
if(KVXFER_PYTHON_VERSION)  # major;minor, from python/CMakeLists.txt
  list(GET KVXFER_PYTHON_VERSION 0 _major)
  list(GET KVXFER_PYTHON_VERSION 1 _minor)
  math(EXPR _next_minor "${_minor} + 1")
  set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
    "python3 (>= ${_major}.${_minor}~), python3 (<< ${_major}.${_next_minor}), python3-numpy")
endif()

set(CPACK_DEBIAN_TOOL_PACKAGE_NAME kvxfer)
set(CPACK_DEBIAN_TOOL_PACKAGE_SECTION net)
# `kvxfer info` and `kvxfer bench` use ucx_info and ucx_perftest when present.
set(CPACK_DEBIAN_TOOL_PACKAGE_RECOMMENDS ucx-utils)

include(CPack)

# Descriptions: the first line is the synopsis, the rest the extended
# description, one paragraph per blank line (CPack indents and adds the " .").
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack would put it before each.
set(_kvxfer_about "kvxfer moves fixed-size KV-cache blocks from one LLM-serving process into
another's registered memory with one-sided WRITEs over UCX, and reports per
peer which writes landed, which failed, and when a peer is faulted.")
cpack_add_component(runtime DISPLAY_NAME "libkvxfer"
  DESCRIPTION "one-sided KV-cache block transfers over UCX - shared library
${_kvxfer_about}

This package contains the shared library.")
cpack_add_component(dev DISPLAY_NAME "libkvxfer development files" DEPENDS runtime
  DESCRIPTION "one-sided KV-cache block transfers over UCX - development files
${_kvxfer_about}

This package contains the C++ headers and the CMake package files for
find_package(kvxfer) and its target kvxfer::kvxfer.")
cpack_add_component(python DISPLAY_NAME "kvxfer Python module" DEPENDS runtime
  DESCRIPTION "one-sided KV-cache block transfers over UCX - Python 3 module
${_kvxfer_about}

This package contains the Python 3 module kvxfer, with kvxfer.NixlTransport,
the drop-in for vLLM's NixlTransport.")
cpack_add_component(tool DISPLAY_NAME "kvxfer command" DEPENDS runtime
  DESCRIPTION "one-sided KV-cache block transfers over UCX - command
${_kvxfer_about}

This package contains the kvxfer command (info, demo, bench).")
