// The Python module: a module with no functions of its own, on CPython's limited API (one
// binary for every CPython from 3.10). Importing it loads the library, whose static
// initializers (STABLE_TORCH_LIBRARY in ops.cpp) register the operators.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "example_stable kernels", -1, nullptr};
  return PyModule_Create(&module);
}
