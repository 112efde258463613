// The pickle machine, restricted: a stack of values in an arena (never a Python object), a mark stack and a memo.
// Every read is checked against the bytes left; every opcode outside the supported set stops the machine with an
// error. No value is walked recursively, so even a self-referencing list cannot make the reader recurse or loop.
#include "io/torch_pickle.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

#include "mambacpp/error.h"

namespace mambacpp {
namespace {

enum class Kind : uint8_t { None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict, Global, Storage, Tensor };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::Str:
      return "str";
    case Kind::Bytes:
      return "bytes";
    case Kind::Tuple:
      return "tuple";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return "dict";
    case Kind::Global:
      return "global";
    case Kind::Storage:
      return "storage";
    case Kind::Tensor:
      return "tensor";
  }
  return "?";
}

// The only globals a tensor checkpoint needs.
enum class Global : uint8_t { OrderedDict, RebuildTensorV2, RebuildParameter, Storage };

struct Value {
  Kind kind = Kind::None;
  Global global = Global::OrderedDict;
  int depth = 0;                // container nesting below this value
  int64_t i = 0;                // Int / Bool; Storage: index into storages; Tensor: index into tensors
  DType dtype = DType::F32;     // Global::Storage
  std::string s;                // Str / Bytes; Global: its dotted name
  std::vector<uint32_t> items;  // Tuple / List elements; Dict: key, value, key, value, ...
};

// Opcodes (pickletools' names).
enum : uint8_t {
  MARK = '(',
  STOP = '.',
  POP = '0',
  POP_MARK = '1',
  DUP = '2',
  BINFLOAT = 'G',
  BININT = 'J',
  BININT1 = 'K',
  BININT2 = 'M',
  NONE = 'N',
  BINPERSID = 'Q',
  REDUCE = 'R',
  BINUNICODE = 'X',
  EMPTY_LIST = ']',
  APPEND = 'a',
  BUILD = 'b',
  DICT = 'd',
  APPENDS = 'e',
  BINGET = 'h',
  LONG_BINGET = 'j',
  LIST = 'l',
  BINPUT = 'q',
  LONG_BINPUT = 'r',
  SETITEM = 's',
  TUPLE = 't',
  SETITEMS = 'u',
  EMPTY_DICT = '}',
  EMPTY_TUPLE = ')',
  GLOBAL = 'c',
  BINBYTES = 'B',
  SHORT_BINBYTES = 'C',
  PROTO = 0x80,
  TUPLE1 = 0x85,
  TUPLE2 = 0x86,
  TUPLE3 = 0x87,
  NEWTRUE = 0x88,
  NEWFALSE = 0x89,
  LONG1 = 0x8a,
  LONG4 = 0x8b,
  SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e,
  STACK_GLOBAL = 0x93,
  MEMOIZE = 0x94,
  FRAME = 0x95,
};

// Names of opcodes that exist but are refused, for the message.
const char* refused_opcode_name(uint8_t op) {
  switch (op) {
    case 'i':
      return "INST (object construction)";
    case 'o':
      return "OBJ (object construction)";
    case 0x81:
      return "NEWOBJ (object construction)";
    case 0x92:
      return "NEWOBJ_EX (object construction)";
    case 0x82:
    case 0x83:
    case 0x84:
      return "EXT (extension registry)";
    case 'P':
      return "PERSID (text persistent id)";
    case 'I':
    case 'L':
    case 'S':
    case 'T':
    case 'U':
    case 'V':
    case 'F':
    case 'p':
    case 'g':
      return "a protocol 0/1 text opcode";
    case 0x8f:
    case 0x90:
    case 0x91:
      return "a set opcode";
    case 0x96:
    case 0x97:
    case 0x98:
      return "an out-of-band buffer opcode";
    default:
      return nullptr;
  }
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 120)) out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  return s.size() > 120 ? out + "..." : out;
}

bool storage_dtype(const std::string& name, DType& out) {
  if (name == "FloatStorage")
    out = DType::F32;
  else if (name == "HalfStorage")
    out = DType::F16;
  else if (name == "BFloat16Storage")
    out = DType::BF16;
  else
    return false;
  return true;
}

class Unpickler {
 public:
  Unpickler(const uint8_t* data, size_t size, const std::string& source) : p_(data), size_(size), source_(source) {}

  TorchPickle run() {
    for (;;) {
      op_pos_ = pos_;
      if (pos_ >= size_) error("the pickle ends without a STOP opcode (truncated file?)");
      op_ = p_[pos_++];
      if (op_ == STOP) break;
      step();
    }
    if (stack_.empty()) error("STOP with an empty stack");
    return finish(stack_.back());
  }

 private:
  template <class... Parts>
  [[noreturn]] void error(const Parts&... parts) const {
    fail(source_, ": pickle byte ", op_pos_, " (opcode 0x", hex(op_), "): ", parts...);
  }
  static std::string hex(uint8_t b) {
    const char* d = "0123456789abcdef";
    return {d[b >> 4], d[b & 15]};
  }

  const uint8_t* take(uint64_t n, const char* what) {
    if (n > size_ - pos_)
      error(what, " of ", n, " bytes runs past the end of the pickle (", size_ - pos_, " bytes left)");
    const uint8_t* at = p_ + pos_;
    pos_ += static_cast<size_t>(n);
    return at;
  }
  uint64_t le(int n, const char* what) {
    const uint8_t* b = take(static_cast<uint64_t>(n), what);
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = v << 8 | b[k];
    return v;
  }

  uint32_t make(Value v) {
    if (v.depth > kMaxPickleNesting) error("containers nested deeper than ", kMaxPickleNesting, " levels");
    values_.push_back(std::move(v));
    return static_cast<uint32_t>(values_.size() - 1);
  }
  void push(uint32_t id) { stack_.push_back(id); }
  void push_new(Value v) { push(make(std::move(v))); }
  uint32_t pop() {
    if (stack_.size() <= floor()) error("pops an empty stack (or past a MARK)");
    const uint32_t id = stack_.back();
    stack_.pop_back();
    return id;
  }
  uint32_t top() {
    if (stack_.size() <= floor()) error("needs a value on the stack");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<uint32_t> pop_to_mark() {
    if (marks_.empty()) error("needs a MARK, and none is open");
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  Value& val(uint32_t id) { return values_[id]; }

  int depth_of(const std::vector<uint32_t>& items) {
    int d = 0;
    for (uint32_t id : items) d = std::max(d, values_[id].depth);
    return d + 1;
  }
  Value container(Kind k, std::vector<uint32_t> items) {
    Value v;
    v.kind = k;
    v.depth = depth_of(items);
    v.items = std::move(items);
    return v;
  }
  // Adds items to the list / dict `target` (APPEND(S), SETITEM(S)).
  void extend(uint32_t target, Kind want, const std::vector<uint32_t>& items) {
    if (val(target).kind != want)
      error("adds items to a ", kind_name(val(target).kind), ", expected a ", kind_name(want));
    if (want == Kind::Dict && items.size() % 2) error("SETITEMS with an odd number of keys and values");
    const int d = depth_of(items);
    if (d > kMaxPickleNesting) error("containers nested deeper than ", kMaxPickleNesting, " levels");
    Value& t = val(target);
    t.depth = std::max(t.depth, d);
    t.items.insert(t.items.end(), items.begin(), items.end());
  }

  void push_int(int64_t x) {
    Value v;
    v.kind = Kind::Int;
    v.i = x;
    push_new(std::move(v));
  }
  void push_string(Kind k, uint64_t n) {
    const uint8_t* b = take(n, k == Kind::Str ? "string" : "bytes");
    Value v;
    v.kind = k;
    v.s.assign(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
    push_new(std::move(v));
  }
  std::string line(const char* what) {
    const size_t start = pos_;
    while (pos_ < size_ && p_[pos_] != '\n') ++pos_;
    if (pos_ >= size_) error("GLOBAL's ", what, " has no terminating newline before the end of the pickle");
    return std::string(reinterpret_cast<const char*>(p_ + start), pos_++ - start);
  }
  void memo_put(uint64_t index) {
    if (memo_.size() >= size_) error("memo grows past the size of the pickle");
    memo_[index] = top();
  }
  void memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) error("memo index ", index, " was never stored");
    push(it->second);
  }

  void push_global(const std::string& module, const std::string& name) {
    Value v;
    v.kind = Kind::Global;
    v.s = module + "." + name;
    DType dt;
    if (module == "collections" && name == "OrderedDict")
      v.global = Global::OrderedDict;
    else if (module == "torch._utils" && name == "_rebuild_tensor_v2")
      v.global = Global::RebuildTensorV2;
    else if (module == "torch._utils" && name == "_rebuild_parameter")
      v.global = Global::RebuildParameter;
    else if (module == "torch" && storage_dtype(name, dt))
      v.global = Global::Storage, v.dtype = dt;
    else if (module == "torch" && name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0)
      error("storage type torch.", printable(name), " is not supported: mambacpp reads torch.FloatStorage (f32), ",
            "torch.HalfStorage (f16) and torch.BFloat16Storage (bf16)");
    else
      error("global '", printable(v.s), "' is not allowed: a tensor checkpoint needs only collections.OrderedDict, ",
            "torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and torch storage types; refusing the ",
            "file (nothing in it is executed)");
    push_new(std::move(v));
  }

  void step() {
    switch (op_) {
      case PROTO: {
        const uint64_t proto = le(1, "protocol number");
        if (proto < 2 || proto > 5) error("pickle protocol ", proto, " (supported: 2 to 5)");
        return;
      }
      case FRAME: {
        const uint64_t n = le(8, "frame length");
        if (n > size_ - pos_) error("frame of ", n, " bytes runs past the end of the pickle (", size_ - pos_, " left)");
        return;  // framing only groups opcodes; the bounds checks stay per read
      }
      case MARK:
        if (marks_.size() >= static_cast<size_t>(kMaxPickleNesting))
          error("more than ", kMaxPickleNesting, " MARKs open at once (nesting too deep)");
        marks_.push_back(stack_.size());
        return;
      case POP:
        pop();
        return;
      case POP_MARK:
        pop_to_mark();
        return;
      case DUP:
        push(top());
        return;
      case EMPTY_TUPLE:
        push_new(container(Kind::Tuple, {}));
        return;
      case EMPTY_LIST:
        push_new(container(Kind::List, {}));
        return;
      case EMPTY_DICT:
        push_new(container(Kind::Dict, {}));
        return;
      case TUPLE:
        push_new(container(Kind::Tuple, pop_to_mark()));
        return;
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        std::vector<uint32_t> items(static_cast<size_t>(op_ - TUPLE1 + 1));
        for (size_t k = items.size(); k-- > 0;) items[k] = pop();
        push_new(container(Kind::Tuple, std::move(items)));
        return;
      }
      case LIST:
        push_new(container(Kind::List, pop_to_mark()));
        return;
      case DICT: {
        std::vector<uint32_t> items = pop_to_mark();
        if (items.size() % 2) error("DICT with an odd number of keys and values");
        push_new(container(Kind::Dict, std::move(items)));
        return;
      }
      case APPEND: {
        const uint32_t v = pop();
        extend(top(), Kind::List, {v});
        return;
      }
      case APPENDS: {
        std::vector<uint32_t> items = pop_to_mark();
        extend(top(), Kind::List, items);
        return;
      }
      case SETITEM: {
        const uint32_t v = pop(), k = pop();
        extend(top(), Kind::Dict, {k, v});
        return;
      }
      case SETITEMS: {
        std::vector<uint32_t> items = pop_to_mark();
        extend(top(), Kind::Dict, items);
        return;
      }
      case NONE:
        push_new(Value{});
        return;
      case NEWTRUE:
      case NEWFALSE: {
        Value v;
        v.kind = Kind::Bool;
        v.i = op_ == NEWTRUE;
        push_new(std::move(v));
        return;
      }
      case BININT:
        push_int(static_cast<int32_t>(static_cast<uint32_t>(le(4, "int"))));
        return;
      case BININT1:
        push_int(static_cast<int64_t>(le(1, "int")));
        return;
      case BININT2:
        push_int(static_cast<int64_t>(le(2, "int")));
        return;
      case LONG1:
      case LONG4: {
        const uint64_t n = le(op_ == LONG1 ? 1 : 4, "long length");
        if (n > 8) error("an integer of ", n, " bytes (at most 8 are supported)");
        uint64_t v = n ? le(static_cast<int>(n), "long") : 0;
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        push_int(static_cast<int64_t>(v));
        return;
      }
      case BINFLOAT: {
        const uint8_t* b = take(8, "float");
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = bits << 8 | b[k];  // big-endian
        Value v;
        v.kind = Kind::Float;
        std::memcpy(&v.i, &bits, 8);  // kept as bits: floats are never used by the checkpoint itself
        push_new(std::move(v));
        return;
      }
      case BINUNICODE:
        push_string(Kind::Str, le(4, "string length"));
        return;
      case SHORT_BINUNICODE:
        push_string(Kind::Str, le(1, "string length"));
        return;
      case BINUNICODE8:
        push_string(Kind::Str, le(8, "string length"));
        return;
      case BINBYTES:
        push_string(Kind::Bytes, le(4, "bytes length"));
        return;
      case SHORT_BINBYTES:
        push_string(Kind::Bytes, le(1, "bytes length"));
        return;
      case BINBYTES8:
        push_string(Kind::Bytes, le(8, "bytes length"));
        return;
      case GLOBAL: {
        const std::string module = line("module");
        const std::string name = line("name");
        push_global(module, name);
        return;
      }
      case STACK_GLOBAL: {
        const uint32_t name = pop(), module = pop();
        if (val(name).kind != Kind::Str || val(module).kind != Kind::Str)
          error("STACK_GLOBAL needs two strings, found ", kind_name(val(module).kind), " and ",
                kind_name(val(name).kind));
        push_global(val(module).s, val(name).s);
        return;
      }
      case BINPUT:
        memo_put(le(1, "memo index"));
        return;
      case LONG_BINPUT:
        memo_put(le(4, "memo index"));
        return;
      case MEMOIZE:
        memo_put(memo_.size());
        return;
      case BINGET:
        memo_get(le(1, "memo index"));
        return;
      case LONG_BINGET:
        memo_get(le(4, "memo index"));
        return;
      case BINPERSID:
        persistent_id(pop());
        return;
      case REDUCE: {
        const uint32_t args = pop(), callable = pop();
        reduce(callable, args);
        return;
      }
      case BUILD: {
        const uint32_t state = pop();
        const Value& target = val(top());
        // OrderedDict state (a state_dict's _metadata attribute) is dropped; nothing else may be built.
        if (target.kind != Kind::Dict)
          error("BUILD on a ", kind_name(target.kind), " (only a dict's attributes may be set, and are ignored)");
        const Kind sk = val(state).kind;
        if (sk != Kind::Dict && sk != Kind::None && sk != Kind::Tuple)
          error("BUILD with a ", kind_name(sk), " state (expected a dict)");
        return;
      }
      default: {
        const char* name = refused_opcode_name(op_);
        if (name) error(name, " is not allowed in a tensor checkpoint");
        error("unknown or unsupported opcode");
      }
    }
  }

  // ('storage', <storage type>, key, location, numel), as torch.save's persistent_id writes it.
  void persistent_id(uint32_t pid) {
    const Value& t = val(pid);
    if (t.kind != Kind::Tuple || t.items.size() != 5)
      error("persistent id must be a 5-tuple ('storage', type, key, location, numel), found a ", kind_name(t.kind),
            t.kind == Kind::Tuple ? " of " + std::to_string(t.items.size()) : std::string());
    const Value &tag = val(t.items[0]), &type = val(t.items[1]), &key = val(t.items[2]), &loc = val(t.items[3]),
                &numel = val(t.items[4]);
    if (tag.kind != Kind::Str) error("persistent id tag must be 'storage', found a ", kind_name(tag.kind));
    if (tag.s != "storage") error("persistent id tag must be 'storage', found '", printable(tag.s), "'");
    if (type.kind != Kind::Global || type.global != Global::Storage)
      error("persistent id names ", type.kind == Kind::Global ? printable(type.s) : kind_name(type.kind),
            " where a storage type was expected");
    if (key.kind != Kind::Str || key.s.empty()) error("storage key must be a non-empty string");
    if (loc.kind != Kind::Str) error("storage location must be a string, found ", kind_name(loc.kind));
    if (numel.kind != Kind::Int || numel.i < 0) error("storage size must be a non-negative integer");
    auto [it, inserted] = storage_index_.try_emplace(key.s, out_.storages.size());
    if (inserted) {
      PickledStorage s;
      s.key = key.s;
      s.type = type.s;
      s.dtype = type.dtype;
      s.numel = static_cast<uint64_t>(numel.i);
      s.location = loc.s;
      out_.storages.push_back(std::move(s));
    } else {
      const PickledStorage& s = out_.storages[it->second];
      if (s.dtype != type.dtype || s.numel != static_cast<uint64_t>(numel.i))
        error("storage '", printable(key.s), "' is described twice differently (", s.type, " of ", s.numel, ", then ",
              type.s, " of ", numel.i, ")");
    }
    Value v;
    v.kind = Kind::Storage;
    v.i = static_cast<int64_t>(it->second);
    push_new(std::move(v));
  }

  std::vector<int64_t> int_tuple(uint32_t id, const char* what) {
    const Value& t = val(id);
    if (t.kind != Kind::Tuple) error(what, " must be a tuple of integers, found a ", kind_name(t.kind));
    if (t.items.size() > 16) error(what, " has ", t.items.size(), " dimensions (at most 16)");
    std::vector<int64_t> out;
    for (uint32_t e : t.items) {
      if (val(e).kind != Kind::Int || val(e).i < 0) error(what, " must hold non-negative integers");
      out.push_back(val(e).i);
    }
    return out;
  }

  void reduce(uint32_t callable, uint32_t args_id) {
    const Value& f = val(callable);
    if (f.kind != Kind::Global)
      error("REDUCE calls a ", kind_name(f.kind), "; only the allowed torch rebuild functions may be called");
    const Value& args = val(args_id);
    if (args.kind != Kind::Tuple) error("REDUCE arguments must be a tuple, found a ", kind_name(args.kind));
    const std::vector<uint32_t> a = args.items;  // copy: pushing below may reallocate values_
    switch (f.global) {
      case Global::OrderedDict:
        if (!a.empty()) error("collections.OrderedDict called with arguments (expected none)");
        push_new(container(Kind::Dict, {}));
        return;
      case Global::RebuildParameter:
        if (a.size() != 3 || val(a[0]).kind != Kind::Tensor)
          error("torch._utils._rebuild_parameter expects (tensor, requires_grad, hooks)");
        push(a[0]);
        return;
      case Global::RebuildTensorV2: {
        if (a.size() != 6 && a.size() != 7)
          error("torch._utils._rebuild_tensor_v2 expects 6 or 7 arguments, found ", a.size());
        if (val(a[0]).kind != Kind::Storage)
          error("torch._utils._rebuild_tensor_v2: first argument must be a storage, found a ",
                kind_name(val(a[0]).kind));
        if (val(a[1]).kind != Kind::Int || val(a[1]).i < 0)
          error("torch._utils._rebuild_tensor_v2: storage offset must be a non-negative integer");
        PickledTensor t;
        t.storage = static_cast<size_t>(val(a[0]).i);
        t.offset = static_cast<uint64_t>(val(a[1]).i);
        t.shape = int_tuple(a[2], "tensor size");
        t.stride = int_tuple(a[3], "tensor stride");
        if (t.shape.size() != t.stride.size())
          error("tensor size has ", t.shape.size(), " dimensions but its stride ", t.stride.size());
        const Kind rg = val(a[4]).kind;
        if (rg != Kind::Bool && rg != Kind::Int) error("requires_grad must be a bool, found ", kind_name(rg));
        if (val(a[5]).kind != Kind::Dict || !val(a[5]).items.empty())
          error("backward hooks must be an empty dict (tensors with hooks are not supported)");
        if (a.size() == 7 && val(a[6]).kind != Kind::None && val(a[6]).kind != Kind::Dict)
          error("tensor metadata must be a dict or None, found ", kind_name(val(a[6]).kind));
        tensors_.push_back(std::move(t));
        Value v;
        v.kind = Kind::Tensor;
        v.i = static_cast<int64_t>(tensors_.size() - 1);
        push_new(std::move(v));
        return;
      }
      case Global::Storage:
        error("REDUCE on ", f.s, ": calling a storage type is not allowed (storages come from persistent ids)");
    }
  }

  // The result must be a flat dict of name -> tensor, each inside its storage and laid out contiguously.
  TorchPickle finish(uint32_t result) {
    op_pos_ = pos_ - 1;
    const Value& d = val(result);
    if (d.kind != Kind::Dict)
      error("the pickle holds a ", kind_name(d.kind), "; expected a dict of tensor name -> tensor (a state_dict)");
    std::map<std::string, bool> names;
    for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
      const Value& key = val(d.items[k]);
      const Value& v = val(d.items[k + 1]);
      if (key.kind != Kind::Str) error("a key of the top-level dict is a ", kind_name(key.kind), ", expected a name");
      if (v.kind != Kind::Tensor)
        error("entry '", printable(key.s), "' is a ", kind_name(v.kind),
              ", expected a tensor (only flat dicts of name -> tensor, i.e. a state_dict, are supported)");
      if (!names.emplace(key.s, true).second) error("tensor '", printable(key.s), "' appears twice");
      PickledTensor t = tensors_[static_cast<size_t>(v.i)];
      t.name = key.s;
      check_layout(t);
      out_.tensors.push_back(std::move(t));
    }
    return std::move(out_);
  }

  void check_layout(const PickledTensor& t) {
    const PickledStorage& s = out_.storages[t.storage];
    const std::string name = printable(t.name);
    uint64_t numel = 1;
    for (int64_t d : t.shape)
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
        error("tensor '", name, "': its size overflows 64 bits");
    // Row-major strides, ignoring dimensions of size 1 (torch may record anything there).
    uint64_t expect = 1;
    for (size_t k = t.shape.size(); k-- > 0;) {
      if (t.shape[k] != 1 && numel > 0 && static_cast<uint64_t>(t.stride[k]) != expect)
        error("tensor '", name, "' is not contiguous (size ", dims(t.shape), ", stride ", dims(t.stride),
              "): such views are not supported; save tensor.contiguous() instead");
      expect *= static_cast<uint64_t>(t.shape[k]);
    }
    uint64_t end = 0;
    if (__builtin_add_overflow(t.offset, numel, &end) || (numel > 0 && end > s.numel))
      error("tensor '", name, "' covers elements [", t.offset, ", ", t.offset, " + ", numel, ") of storage '",
            printable(s.key), "', which has ", s.numel, " elements");
  }
  static std::string dims(const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
    return s + "]";
  }

  const uint8_t* p_;
  size_t size_;
  const std::string& source_;
  size_t pos_ = 0, op_pos_ = 0;
  uint8_t op_ = 0;
  std::vector<Value> values_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::map<std::string, size_t> storage_index_;
  std::vector<PickledTensor> tensors_;
  TorchPickle out_;
};

}  // namespace

TorchPickle read_torch_pickle(const uint8_t* data, size_t size, const std::string& source) {
  return Unpickler(data, size, source).run();
}

}  // namespace mambacpp
