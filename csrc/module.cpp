// The extension module rwkv._C. It exists only so that importing it runs the static
// TORCH_LIBRARY_IMPL registrations in the other translation units; it defines no Python
// functions (the op schemas are declared in Python, rwkv/ops/_schemas.py).
#include <Python.h>

extern "C" {
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}
