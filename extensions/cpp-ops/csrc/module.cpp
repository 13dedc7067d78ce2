// The Python module: a module with no functions of its own. Importing it loads the library,
// whose static initializers (TORCH_LIBRARY in ops.cpp) register the operators.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "example_ops CPU kernels", -1, nullptr};
  return PyModule_Create(&module);
}
