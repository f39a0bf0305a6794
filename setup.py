"""Thin build script: runs CMake (CMakeLists.txt is the one list of sources) to build ringzero._C.

`pip install --no-build-isolation .` builds against the installed torch: the CUDA layers when torch has
CUDA and nvcc is found, the CPU path otherwise (it says which). RINGZERO_CUDA=0|1 forces the choice.
"""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()


def _cuda_choice():
    forced = os.environ.get("RINGZERO_CUDA")
    if forced in ("0", "1"):
        return forced == "1", f"RINGZERO_CUDA={forced}"
    import shutil

    import torch

    if torch.version.cuda is None:
        return False, "torch is a CPU build"
    if shutil.which("nvcc") is None and not os.environ.get("CUDACXX"):
        return False, "nvcc was not found"
    return True, f"torch {torch.__version__} with CUDA {torch.version.cuda} and nvcc"


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch.utils

        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        with_cuda, why = _cuda_choice()
        print(f"ringzero: building the {'CUDA' if with_cuda else 'CPU'} path ({why})", flush=True)
        cfg = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DRINGZERO_BUILD_PYTHON=ON",
            "-DRINGZERO_BUILD_TESTS=OFF",
            f"-DRINGZERO_CUDA={'ON' if with_cuda else 'OFF'}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
        ]
        subprocess.check_call(cfg)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_C", "-j", jobs])


setup(
    ext_modules=[Extension("ringzero._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
