// rwkv._tokenizer: the World tokenizer's hot loops in C++ (plain CPython C API, no torch).
//
// Tokenizer(encode_items, decode_items)
//   encode_items: list of (bytes token, int id)   -- TRIE_TOKENIZER.token2idx.items()
//   decode_items: list of (int id, bytes token)   -- TRIE_TOKENIZER.idx2token.items()
// .encode(bytes-like) -> list[int]   greedy longest match (identical to the Python reference);
//                                    ValueError when no token matches some byte
// .decode(list|tuple) -> bytes       KeyError(id) for an unknown id (as a dict lookup would);
//                                    None when an element is not a Python int (caller falls back)
//
// Every index is bounds-checked; no input can make it read outside its tables.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

constexpr int64_t kMaxDecodeId = 1 << 24;  // larger ids: the caller keeps the Python dict path

struct Trie {
  // Node 0 is the root. Children of node n: edge_byte/edge_child[first .. first + count), sorted by
  // byte. Nodes with many children (the root among them) also get a dense 256-entry table in
  // `dense` (child or 0; node 0 is never a child). Sizes: ~116k nodes, ~2.7k dense tables.
  struct Node {
    int32_t token;   // token id ending at the node, -1 if none
    uint32_t first;
    uint32_t count;
    int32_t dense;   // index of the node's dense table, -1 if none
  };
  static constexpr uint32_t kDenseMin = 5;
  std::vector<Node> nodes;
  std::vector<uint8_t> edge_byte;
  std::vector<uint32_t> edge_child;
  std::vector<uint32_t> dense;

  uint32_t child(uint32_t node, uint8_t b) const {
    const Node& nd = nodes[node];
    if (nd.dense >= 0) return dense[static_cast<size_t>(nd.dense) * 256 + b];
    const uint8_t* bytes = edge_byte.data() + nd.first;
    for (uint32_t i = 0; i < nd.count; ++i)
      if (bytes[i] == b) return edge_child[nd.first + i];
    return 0;
  }
};

struct BuildNode {
  int32_t token = -1;
  std::vector<std::pair<uint8_t, uint32_t>> kids;  // kept sorted by byte
};

struct TokenizerObject {
  PyObject_HEAD
  Trie* trie;
  std::vector<uint32_t>* dec_off;  // id -> offset into dec_bytes; dec_off[id+1]-dec_off[id] = length
  std::vector<uint8_t>* dec_known;
  std::string* dec_bytes;
  std::vector<PyObject*>* id_objs;  // cached int objects for every id that encode can return
};

bool build_trie(PyObject* items, Trie* trie) {
  PyObject* seq = PySequence_Fast(items, "encode_items must be a sequence of (bytes, int)");
  if (!seq) return false;
  std::vector<BuildNode> nodes(1);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, k);
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(item, 0)) ||
        !PyLong_Check(PyTuple_GET_ITEM(item, 1))) {
      PyErr_SetString(PyExc_TypeError, "encode_items must hold (bytes, int) pairs");
      Py_DECREF(seq);
      return false;
    }
    long id = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
    if ((id == -1 && PyErr_Occurred()) || id < 0 || id > INT32_MAX) {
      PyErr_Clear();
      PyErr_SetString(PyExc_ValueError, "token ids must be in 0..2**31-1");
      Py_DECREF(seq);
      return false;
    }
    PyObject* key = PyTuple_GET_ITEM(item, 0);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(key));
    const Py_ssize_t len = PyBytes_GET_SIZE(key);
    uint32_t node = 0;
    for (Py_ssize_t i = 0; i < len; ++i) {
      auto& kids = nodes[node].kids;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(p[i], uint32_t(0)),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
      if (it != kids.end() && it->first == p[i]) {
        node = it->second;
      } else {
        const uint32_t fresh = static_cast<uint32_t>(nodes.size());
        kids.insert(it, std::make_pair(p[i], fresh));
        nodes.emplace_back();
        node = fresh;
      }
    }
    if (len > 0) nodes[node].token = static_cast<int32_t>(id);  // the empty token can never match
  }
  Py_DECREF(seq);

  const size_t nn = nodes.size();
  trie->nodes.resize(nn);
  for (size_t i = 0; i < nn; ++i) {
    Trie::Node& out = trie->nodes[i];
    out.token = nodes[i].token;
    out.first = static_cast<uint32_t>(trie->edge_byte.size());
    out.count = static_cast<uint32_t>(nodes[i].kids.size());
    out.dense = -1;
    for (const auto& kv : nodes[i].kids) {
      trie->edge_byte.push_back(kv.first);
      trie->edge_child.push_back(kv.second);
    }
    if (i == 0 || out.count >= Trie::kDenseMin) {
      out.dense = static_cast<int32_t>(trie->dense.size() / 256);
      trie->dense.resize(trie->dense.size() + 256, 0);
      for (const auto& kv : nodes[i].kids) trie->dense[static_cast<size_t>(out.dense) * 256 + kv.first] = kv.second;
    }
  }
  return true;
}

bool build_decoder(PyObject* items, TokenizerObject* self) {
  PyObject* seq = PySequence_Fast(items, "decode_items must be a sequence of (int, bytes)");
  if (!seq) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  std::vector<std::pair<int64_t, PyObject*>> entries;
  int64_t max_id = -1;
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, k);
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyLong_Check(PyTuple_GET_ITEM(item, 0)) ||
        !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
      PyErr_SetString(PyExc_TypeError, "decode_items must hold (int, bytes) pairs");
      Py_DECREF(seq);
      return false;
    }
    int overflow = 0;
    long long id = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(item, 0), &overflow);
    if (overflow || id < 0 || id >= kMaxDecodeId) {
      PyErr_SetString(PyExc_ValueError, "token ids must be in 0..2**24-1 for the native decoder");
      Py_DECREF(seq);
      return false;
    }
    entries.emplace_back(id, PyTuple_GET_ITEM(item, 1));
    max_id = std::max<int64_t>(max_id, id);
  }
  const size_t size = static_cast<size_t>(max_id + 1);
  std::vector<std::pair<uint32_t, uint32_t>> span(size, {0, 0});  // (offset, length)
  self->dec_known->assign(size, 0);
  for (const auto& e : entries) {  // later entries win, as in a dict built in order
    const char* p = PyBytes_AS_STRING(e.second);
    const Py_ssize_t len = PyBytes_GET_SIZE(e.second);
    span[e.first] = {static_cast<uint32_t>(self->dec_bytes->size()), static_cast<uint32_t>(len)};
    self->dec_bytes->append(p, static_cast<size_t>(len));
    (*self->dec_known)[e.first] = 1;
  }
  Py_DECREF(seq);
  self->dec_off->assign(2 * size, 0);
  for (size_t i = 0; i < size; ++i) {
    (*self->dec_off)[2 * i] = span[i].first;
    (*self->dec_off)[2 * i + 1] = span[i].second;
  }
  return true;
}

void release_id_objs(TokenizerObject* self) {
  if (!self->id_objs) return;
  for (PyObject* o : *self->id_objs) Py_XDECREF(o);
  delete self->id_objs;
  self->id_objs = nullptr;
}

bool build_id_objs(TokenizerObject* self) {
  int32_t max_id = -1;
  for (const auto& nd : self->trie->nodes) max_id = std::max(max_id, nd.token);
  self->id_objs = new std::vector<PyObject*>(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& nd : self->trie->nodes) {
    if (nd.token < 0 || (*self->id_objs)[nd.token]) continue;
    PyObject* o = PyLong_FromLong(nd.token);
    if (!o) return false;
    (*self->id_objs)[nd.token] = o;
  }
  return true;
}

void tok_dealloc(TokenizerObject* self) {
  delete self->trie;
  delete self->dec_off;
  delete self->dec_known;
  delete self->dec_bytes;
  release_id_objs(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int tok_init(TokenizerObject* self, PyObject* args, PyObject* kwds) {
  static const char* kwlist[] = {"encode_items", "decode_items", nullptr};
  PyObject *enc = nullptr, *dec = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", const_cast<char**>(kwlist), &enc, &dec)) return -1;
  if (self->trie) {  // tables may be in use by an encode running without the GIL
    PyErr_SetString(PyExc_RuntimeError, "Tokenizer is already initialised; create a new one");
    return -1;
  }
  try {
    self->trie = new Trie();
    self->dec_off = new std::vector<uint32_t>();
    self->dec_known = new std::vector<uint8_t>();
    self->dec_bytes = new std::string();
    if (!build_trie(enc, self->trie)) return -1;
    if (!build_decoder(dec, self)) return -1;
    if (!build_id_objs(self)) return -1;
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

bool encode_span(const Trie& t, const uint8_t* src, size_t n, std::vector<int32_t>& out, size_t* bad_pos) {
  size_t pos = 0;
  while (pos < n) {
    int32_t best = -1;
    size_t best_end = pos;
    size_t i = pos;
    uint32_t node = t.dense[src[i]];  // the root's dense table is table 0
    while (node != 0) {
      ++i;
      const int32_t tok = t.nodes[node].token;
      if (tok >= 0) {
        best = tok;
        best_end = i;
      }
      if (i == n) break;
      node = t.child(node, src[i]);
    }
    if (best < 0) {
      *bad_pos = pos;
      return false;
    }
    out.push_back(best);
    pos = best_end;
  }
  return true;
}

PyObject* tok_encode(TokenizerObject* self, PyObject* arg) {
  if (!self->trie || !self->id_objs) {
    PyErr_SetString(PyExc_RuntimeError, "Tokenizer is not initialised");
    return nullptr;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return nullptr;
  std::vector<int32_t> ids;
  size_t bad_pos = 0;
  bool ok = true;
  try {
    ids.reserve(static_cast<size_t>(view.len) / 3 + 8);
    const uint8_t* src = static_cast<const uint8_t*>(view.buf);
    const size_t n = static_cast<size_t>(view.len);
    if (n > 4096) {
      Py_BEGIN_ALLOW_THREADS
      ok = encode_span(*self->trie, src, n, ids, &bad_pos);
      Py_END_ALLOW_THREADS
    } else {
      ok = encode_span(*self->trie, src, n, ids, &bad_pos);
    }
  } catch (const std::bad_alloc&) {
    PyBuffer_Release(&view);
    return PyErr_NoMemory();
  }
  PyBuffer_Release(&view);
  if (!ok) {
    PyErr_Format(PyExc_ValueError, "no vocabulary token matches the bytes at position %zu", bad_pos);
    return nullptr;
  }
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(ids.size()));
  if (!list) return nullptr;
  for (size_t k = 0; k < ids.size(); ++k) {
    PyObject* v = (*self->id_objs)[ids[k]];  // ids come from the trie, so the slot is filled
    Py_INCREF(v);
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), v);
  }
  return list;
}

PyObject* tok_decode(TokenizerObject* self, PyObject* arg) {
  if (!self->trie || !self->id_objs) {
    PyErr_SetString(PyExc_RuntimeError, "Tokenizer is not initialised");
    return nullptr;
  }
  if (!PyList_Check(arg) && !PyTuple_Check(arg)) {
    PyErr_SetString(PyExc_TypeError, "decode expects a list or tuple of ints");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(arg, "decode expects a list or tuple");  // new ref; pins the items
  if (!seq) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  const std::vector<uint32_t>& off = *self->dec_off;
  const std::vector<uint8_t>& known = *self->dec_known;
  const std::string& bytes = *self->dec_bytes;
  std::string out;
  try {
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq, k);
      if (!PyLong_Check(item)) {  // numpy ints, floats, tensors...: the dict lookup decides
        Py_DECREF(seq);
        Py_RETURN_NONE;
      }
      int overflow = 0;
      long long id = PyLong_AsLongLongAndOverflow(item, &overflow);
      if (id == -1 && PyErr_Occurred()) {
        Py_DECREF(seq);
        return nullptr;
      }
      if (overflow || id < 0 || static_cast<unsigned long long>(id) >= known.size() || !known[id]) {
        PyErr_SetObject(PyExc_KeyError, item);
        Py_DECREF(seq);
        return nullptr;
      }
      out.append(bytes, off[2 * id], off[2 * id + 1]);
    }
  } catch (const std::bad_alloc&) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  Py_DECREF(seq);
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

PyObject* tok_new(PyTypeObject* type, PyObject*, PyObject*) {
  TokenizerObject* self = reinterpret_cast<TokenizerObject*>(type->tp_alloc(type, 0));
  if (self) {
    self->trie = nullptr;
    self->dec_off = nullptr;
    self->dec_known = nullptr;
    self->dec_bytes = nullptr;
    self->id_objs = nullptr;
  }
  return reinterpret_cast<PyObject*>(self);
}

PyMethodDef tok_methods[] = {
    {"encode", reinterpret_cast<PyCFunction>(tok_encode), METH_O,
     "encode(bytes-like) -> list[int]: greedy longest match over the vocabulary trie"},
    {"decode", reinterpret_cast<PyCFunction>(tok_decode), METH_O,
     "decode(list|tuple of int) -> bytes; KeyError for an unknown id; None for non-int elements"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject TokenizerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "rwkv._tokenizer",
                          "World tokenizer hot loops (C++); see rwkv/rwkv_tokenizer.py", -1,
                          nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__tokenizer(void) {
  TokenizerType.tp_name = "rwkv._tokenizer.Tokenizer";
  TokenizerType.tp_basicsize = sizeof(TokenizerObject);
  TokenizerType.tp_flags = Py_TPFLAGS_DEFAULT;
  TokenizerType.tp_doc = "Tokenizer(encode_items, decode_items): World tokenizer tables";
  TokenizerType.tp_new = tok_new;
  TokenizerType.tp_init = reinterpret_cast<initproc>(tok_init);
  TokenizerType.tp_dealloc = reinterpret_cast<destructor>(tok_dealloc);
  TokenizerType.tp_methods = tok_methods;
  if (PyType_Ready(&TokenizerType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&TokenizerType);
  if (PyModule_AddObject(m, "Tokenizer", reinterpret_cast<PyObject*>(&TokenizerType)) < 0) {
    Py_DECREF(&TokenizerType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
