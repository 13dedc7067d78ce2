import importlib.metadata

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# The wheel pins the exact torch it was compiled against: torch's C++ ABI is not stable
# across releases.
TORCH = importlib.metadata.version("torch")

setup(
    name="example-cpp-ops",
    version="0.1.0",
    description="example_ops: CPU kernels registered with torch.ops (a wheelmill example)",
    packages=["example_cpp_ops"],
    ext_modules=[
        CppExtension("example_cpp_ops._C", ["csrc/ops.cpp", "csrc/module.cpp"], extra_compile_args={"cxx": ["-O3"]})
    ],
    install_requires=[f"torch=={TORCH}"],
    python_requires=">=3.9",
    cmdclass={"build_ext": BuildExtension},
)
