"""Builds mambacpp's extension with the repository's CMake build and adds it and the shipped model to the package.

MAMBACPP_BUILD_DIR: a CMake build directory to reuse (only the module target is built there, so the library is not
compiled twice; CI passes its own `build`); a relative path is taken from the repository root (pip runs this script
in python/). Default: <repo>/build-python, configured here when it is new.
MAMBACPP_CMAKE_ARGS: extra configure arguments for a new build directory (e.g. "-DMAMBACPP_CUDA=OFF").
"""

import glob
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build_dir = (ROOT / os.environ.get("MAMBACPP_BUILD_DIR", "build-python")).resolve()
        if not (build_dir / "CMakeCache.txt").exists():
            subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                                   "-DMAMBACPP_TESTS=OFF", "-DMAMBACPP_PYTHON=ON",
                                   f"-DPython3_EXECUTABLE={sys.executable}",
                                   *shlex.split(os.environ.get("MAMBACPP_CMAKE_ARGS", ""))])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "mambacpp_python"])
        built = glob.glob(str(build_dir / "python" / "mambacpp" / "_mambacpp*.so"))
        if len(built) != 1:
            sys.exit(f"expected one built _mambacpp*.so under {build_dir}/python/mambacpp, found {built}")
        package = pathlib.Path(self.build_lib) / "mambacpp"
        shutil.copy2(built[0], package)
        # The shipped model as package data: Model() finds it next to the package.
        models = package / "models" / "default"
        models.mkdir(parents=True, exist_ok=True)
        for name in MODEL_FILES:
            shutil.copy2(ROOT / "models" / "default" / name, models / name)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: the package holds a compiled extension
        return True


setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
