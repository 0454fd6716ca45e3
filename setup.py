# SPDX-License-Identifier: Apache-2.0
"""Builds the kvxfer wheel: CMake makes the _kvxfer extension, libkvxfer and
the kvxfer command.

The version is project(kvxfer VERSION ...) in CMakeLists.txt, the one source
of truth. The extension is configured for the interpreter running this build
(sys.executable, e.g. a venv's python), so it matches the environment pip
installs into. The wheel holds libkvxfer.so.N beside the extension, which
finds it through its RPATH $ORIGIN: no system libkvxfer is needed, and the
one in the wheel is used even when another is installed. The kvxfer tool
goes in as kvxfer/bin/kvxfer (RPATH $ORIGIN/..), run by the `kvxfer` console
script and `python3 -m kvxfer`. See pyproject.toml for how to run it.

Building takes minutes and pip shows nothing meanwhile unless asked
(`pip install -v`); `make wheel` builds a wheel once for venvs without a
compiler.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


def project_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*kvxfer\s+VERSION\s+([0-9][0-9.]*)", text)
    if match is None:
        raise RuntimeError("no project(kvxfer VERSION ...) in CMakeLists.txt")
    return match.group(1)


class CMakeBuild(build_ext):
    """Configures, builds and installs the python + runtime components into a
    staging dir, then copies the extension and libkvxfer.so.N into the wheel."""

    def build_extension(self, ext: Extension) -> None:
        temp = pathlib.Path(self.build_temp).resolve()
        # KVXFER_CMAKE_BUILD_DIR: build in this tree instead of a fresh one
        # (the package tests reuse the tree the .debs were built in). Built
        # as the build tree and the .debs are (RelWithDebInfo), stripped on
        # install.
        cmake_dir = pathlib.Path(os.environ.get("KVXFER_CMAKE_BUILD_DIR") or temp / "cmake")
        stage = temp / "stage"
        shutil.rmtree(stage, ignore_errors=True)
        # KVXFER_WHEEL: python/CMakeLists.txt adds the tool's install into
        # the package (component wheel_tool) for this configure only.
        env = {**os.environ, "KVXFER_WHEEL": "1"}
        subprocess.run(
            [
                "cmake", "-S", str(ROOT), "-B", str(cmake_dir),
                "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                f"-DPython_EXECUTABLE={sys.executable}",
                "-DKVXFER_BUILD_PYTHON=ON",
                "-DKVXFER_BUILD_TESTS=OFF",
                "-DKVXFER_BUILD_TOOLS=ON",
                "-DKVXFER_BUILD_BENCH=OFF",
                # The library and the package land in one directory, so the
                # extension's install RPATH (python/CMakeLists.txt) is $ORIGIN.
                f"-DCMAKE_INSTALL_PREFIX={stage}",
                f"-DCMAKE_INSTALL_LIBDIR={stage / 'kvxfer'}",
                f"-DKVXFER_PYTHON_INSTALL_DIR={stage}",
            ],
            check=True,
            env=env,
        )
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(
            ["cmake", "--build", str(cmake_dir), "--target", "_kvxfer", "kvxfer_cli", "-j", jobs],
            check=True,
            env=env,
        )
        for component in ("runtime", "python", "wheel_tool"):
            subprocess.run(
                ["cmake", "--install", str(cmake_dir), "--component", component, "--strip"],
                check=True,
            )

        package = stage / "kvxfer"
        extension = pathlib.Path(self.get_ext_fullpath(ext.name))
        extension.parent.mkdir(parents=True, exist_ok=True)
        built = list(package.glob("_kvxfer.*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _kvxfer extension in {package}, found {built}")
        shutil.copyfile(built[0], extension)
        # Only the SONAME file (libkvxfer.so.N) is loaded; copy it as a file
        # (the build's symlink chain would become duplicate copies in a wheel).
        sonames = [p for p in package.iterdir() if re.fullmatch(r"libkvxfer\.so\.\d+", p.name)]
        if len(sonames) != 1:
            raise RuntimeError(f"expected one libkvxfer.so.N in {package}, found {sonames}")
        shutil.copyfile(sonames[0], extension.parent / sonames[0].name)
        tool = package / "bin" / "kvxfer"
        if not tool.is_file():
            raise RuntimeError(f"expected the kvxfer tool at {tool}")
        (extension.parent / "bin").mkdir(exist_ok=True)
        shutil.copy2(tool, extension.parent / "bin" / "kvxfer")  # keeps it executable


# Everything setuptools writes goes under build/pip (ignored by git), away
# from the CMake build trees.
(ROOT / "build" / "pip").mkdir(parents=True, exist_ok=True)
setup(
    version=project_version(),
    packages=["kvxfer", "kvxfer.nixl"],
    package_dir={"kvxfer": "python/kvxfer", "kvxfer.nixl": "python/kvxfer/nixl"},
    ext_modules=[Extension("kvxfer._kvxfer", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build/pip"}, "egg_info": {"egg_base": "build/pip"}},
    zip_safe=False,
)
