// The Python module: importing it loads the library, which registers the CUDA kernels.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "example_ops CUDA kernels", -1, nullptr};
  return PyModule_Create(&module);
}
