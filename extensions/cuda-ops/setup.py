import importlib.metadata

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

# Exact pins: the torch this was compiled against, and the operator library whose schemas
# the kernels implement.
TORCH = importlib.metadata.version("torch")
OPS = importlib.metadata.version("example-cpp-ops")

setup(
    name="example-cuda-ops",
    version="0.1.0",
    description="CUDA kernels for the example_ops operators (a wheelmill example)",
    packages=["example_cuda_ops"],
    ext_modules=[
        CUDAExtension(
            "example_cuda_ops._C",
            ["csrc/module.cpp", "csrc/ops.cpp", "csrc/kernels.cu"],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
        )
    ],
    install_requires=[f"torch=={TORCH}", f"example-cpp-ops=={OPS}"],
    python_requires=">=3.9",
    cmdclass={"build_ext": BuildExtension},
)
