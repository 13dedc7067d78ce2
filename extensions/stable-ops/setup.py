import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

# One wheel for every torch from 2.10 and every CPython from 3.10: the kernels reach torch
# only through its stable C ABI, written against the API of torch 2.10 whatever torch
# builds them, and the module uses CPython's limited API alone.
TORCH_TARGET = "0x020A000000000000"  # torch 2.10
PYTHON_TARGET = "0x030A0000"  # CPython 3.10
macros = [("TORCH_TARGET_VERSION", TORCH_TARGET), ("Py_LIMITED_API", PYTHON_TARGET)]
# CUDA kernels where the build has a toolkit and a CUDA torch (a CUDA cell), else CPU alone.
cuda = torch.version.cuda is not None and CUDA_HOME is not None and os.environ.get("EXAMPLE_STABLE_CPU_ONLY") != "1"
sources = ["csrc/ops.cpp", "csrc/module.cpp"] + (["csrc/ops_cuda.cpp", "csrc/kernels.cu"] if cuda else [])
Extension = CUDAExtension if cuda else CppExtension
flags = {"cxx": ["-O3"], **({"nvcc": ["-O3"]} if cuda else {})}

setup(
    name="example-stable-ops",
    version="0.1.0",
    description="example_stable: kernels on PyTorch's stable ABI, one wheel for many torch and Python releases",
    packages=["example_stable_ops"],
    ext_modules=[
        Extension(
            "example_stable_ops._C",
            sources,
            define_macros=macros + ([("USE_CUDA", "1")] if cuda else []),  # the shims of CUDA streams
            extra_compile_args=flags,
            py_limited_api=True,
        )
    ],
    install_requires=["torch>=2.10"],
    python_requires=">=3.10",
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
