// Calling a C++ function from Python through the CPython API alone (no pybind11: its
// dispatcher alone costs ~3 s of compile time per module). Positional or keyword
// arguments, converted the way pybind11 converts them; errors are raised as C++
// exceptions and turned into Python ones at the module boundary (guarded() in the binding).
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dsfast {
namespace py_call {

// A Python exception to raise once back at the module boundary (see guarded()).
struct PyError {
  PyObject* type;
  std::string message;
};
struct PyErrorAlreadySet {};  // the Python error indicator is set already

[[noreturn]] inline void type_error(const std::string& m) { throw PyError{PyExc_TypeError, m}; }
[[noreturn]] inline void value_error(const std::string& m) { throw PyError{PyExc_ValueError, m}; }

// An owned reference.
class Ref {
 public:
  explicit Ref(PyObject* o = nullptr) : o_(o) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(o_); }
  PyObject* get() const { return o_; }
  PyObject* ok() const {  // the object, or throw the error that produced nullptr
    if (!o_) throw PyErrorAlreadySet{};
    return o_;
  }

 private:
  PyObject* o_;
};

// Releases the GIL for the kernel (restored on every exit, exceptions included).
class NoGil {
 public:
  NoGil() : state_(PyEval_SaveThread()) {}
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;
  ~NoGil() { PyEval_RestoreThread(state_); }

 private:
  PyThreadState* state_;
};

// The arguments of one call by parameter position (nullptr: not given).
class Args {
 public:
  Args(const char* fn, const char* const* names, size_t count, size_t required, PyObject* const* args,
       Py_ssize_t nargs, PyObject* kwnames)
      : fn_(fn), names_(names), vals_(count, nullptr) {
    if (size_t(nargs) > count)
      type_error(std::string(fn) + "() takes at most " + std::to_string(count) + " arguments (" +
                 std::to_string(nargs) + " given)");
    for (Py_ssize_t i = 0; i < nargs; ++i) vals_[i] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      size_t j = 0;
      while (j < count && PyUnicode_CompareWithASCIIString(key, names[j]) != 0) ++j;
      const char* key_s = PyUnicode_AsUTF8(key);
      if (j == count)
        type_error(std::string(fn) + "() got an unexpected keyword argument '" + (key_s ? key_s : "?") + "'");
      if (vals_[j]) type_error(std::string(fn) + "() got multiple values for argument '" + names[j] + "'");
      vals_[j] = args[nargs + k];
    }
    for (size_t j = 0; j < required; ++j)
      if (!vals_[j]) type_error(std::string(fn) + "() missing required argument '" + names[j] + "'");
  }
  PyObject* operator[](size_t j) const { return vals_[j]; }

  [[noreturn]] void bad(size_t j, const char* want) const {
    type_error(std::string(fn_) + "(): argument '" + names_[j] + "' must be " + want + ", not " +
               Py_TYPE(vals_[j])->tp_name);
  }
  double number(size_t j, double dflt) const {  // float, int or anything with __float__/__index__
    PyObject* o = vals_[j];
    if (!o) return dflt;
    if (PyFloat_Check(o)) return PyFloat_AS_DOUBLE(o);
    const double d = PyFloat_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      bad(j, "a number");
    }
    return d;
  }
  int64_t integer(size_t j, int64_t dflt) const {  // int or __index__; never a float
    PyObject* o = vals_[j];
    if (!o) return dflt;
    if (PyFloat_Check(o)) bad(j, "an integer");
    const long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      bad(j, "an integer");
    }
    return int64_t(v);
  }
  bool flag(size_t j) const { return truth(vals_[j], j); }
  bool truth(PyObject* o, size_t j) const {  // True/False, None, or a type with __bool__ (numpy.bool_, int)
    if (o == Py_True) return true;
    if (o == Py_False || o == Py_None) return false;
    if (Py_TYPE(o)->tp_as_number && Py_TYPE(o)->tp_as_number->nb_bool) {
      const int r = Py_TYPE(o)->tp_as_number->nb_bool(o);
      if (r >= 0) return r != 0;
      PyErr_Clear();
    }
    bad(j, "a bool");
  }
  std::string text(size_t j, const char* dflt) const {
    PyObject* o = vals_[j];
    if (!o) return dflt;
    if (PyUnicode_Check(o)) {
      Py_ssize_t n = 0;
      const char* c = PyUnicode_AsUTF8AndSize(o, &n);
      if (!c) throw PyErrorAlreadySet{};
      return std::string(c, size_t(n));
    }
    if (PyBytes_Check(o)) return std::string(PyBytes_AS_STRING(o), size_t(PyBytes_GET_SIZE(o)));
    bad(j, "a str");
  }
  std::vector<bool> flags(size_t j) const {  // a sequence (not a str) of bools
    PyObject* o = vals_[j];
    if (PyUnicode_Check(o) || PyBytes_Check(o) || !PySequence_Check(o)) bad(j, "a list of bools");
    Ref seq(PySequence_Fast(o, "not a sequence"));
    if (!seq.get()) {
      PyErr_Clear();
      bad(j, "a list of bools");
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.get());
    std::vector<bool> out(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) out[size_t(i)] = truth(PySequence_Fast_GET_ITEM(seq.get(), i), j);
    return out;
  }

 private:
  const char* fn_;
  const char* const* names_;
  std::vector<PyObject*> vals_;
};

}  // namespace py_call
}  // namespace dsfast
