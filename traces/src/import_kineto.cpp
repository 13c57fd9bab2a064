// The Kineto importer: PyTorch profiler Chrome-trace JSON (one file per rank) into a Trace. The
// mapping rules are in import.hpp; this file reads the JSON and applies them per file, then hands
// the draft to finish_import() for what both formats share.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "import_common.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/import.hpp"
#include "orrery/traces/kernel_work.hpp"

namespace orrery::traces {

using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// JSON: a DOM built through nlohmann's SAX interface so that "ts" and "dur" keep their decimal
// text (a double cannot hold a Unix-epoch microsecond time to the nanosecond). The parser and this
// builder are iterative: deep nesting cannot overflow the stack.

class DomBuilder {
 public:
  json root;
  std::string error;

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t& text) {
    if (raw_key_) return put(json(text));
    return put(json(v));
  }
  bool string(json::string_t& s) { return put(json(std::move(s))); }
  bool binary(json::binary_t& /*unused*/) { return put(json(nullptr)); }
  bool start_object(std::size_t /*unused*/) { return open(json::object()); }
  bool start_array(std::size_t /*unused*/) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    key_ = std::move(k);
    raw_key_ = key_ == "ts" || key_ == "dur";
    return true;
  }
  bool parse_error(std::size_t /*pos*/, const std::string& /*token*/,
                   const nlohmann::detail::exception& ex) {
    error = ex.what();
    return false;
  }

 private:
  json* insert(json&& v) {
    raw_key_ = false;
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool put(json&& v) {
    insert(std::move(v));
    return true;
  }
  bool open(json&& v) {
    stack_.push_back(insert(std::move(v)));
    return true;
  }
  bool close() {
    if (!stack_.empty()) stack_.pop_back();
    return true;
  }

  std::vector<json*> stack_;
  std::string key_;
  bool raw_key_ = false;
};

json parse_json(std::string_view text, const std::string& name) {
  DomBuilder b;
  const bool ok = json::sax_parse(text.begin(), text.end(), &b);
  if (!ok) throw InputError(name + ": not valid JSON (" + b.error + ")");
  return std::move(b.root);
}

// ---------------------------------------------------------------------------------------------
// Small accessors that never throw on a wrong type.

const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::optional<int64_t> as_int(const json* v) {
  if (!v) return std::nullopt;
  if (v->is_number_integer() && !v->is_number_unsigned()) return v->get<int64_t>();
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 9.0e18) return std::nullopt;
    return static_cast<int64_t>(std::llround(d));
  }
  if (v->is_string()) {  // a number written as text ("rank": "3")
    const auto& s = v->get_ref<const std::string&>();
    if (s.empty() || s.size() > 18) return std::nullopt;
    int64_t x = 0;
    size_t i = s[0] == '-' ? 1 : 0;
    if (i == s.size()) return std::nullopt;
    for (; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      x = x * 10 + (s[i] - '0');
    }
    return s[0] == '-' ? -x : x;
  }
  return std::nullopt;
}

std::string as_str(const json* v) {
  if (!v) return {};
  if (v->is_string()) return v->get<std::string>();
  if (v->is_number_integer() || v->is_number_unsigned()) return v->dump();
  return {};
}

// Microseconds (an integer, or the decimal text kept by DomBuilder) -> ns, exactly, rounding half
// away from zero below the nanosecond. nullopt when not a number or out of int64 range.
std::optional<int64_t> us_to_ns(const json* v) {
  if (!v) return std::nullopt;
  if (v->is_number_integer()) {
    const auto us = as_int(v);
    int64_t ns = 0;
    if (!us || __builtin_mul_overflow(*us, int64_t{1000}, &ns)) return std::nullopt;
    return ns;
  }
  if (!v->is_string()) return std::nullopt;
  const auto& s = v->get_ref<const std::string&>();
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  std::string digits;
  int64_t exp10 = 0;  // value = digits * 10^exp10
  bool any = false, dot = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      any = true;
      if (!(digits.empty() && c == '0')) digits += c;  // no leading zeros
      if (dot) --exp10;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
    if (digits.size() > 40) return std::nullopt;
  }
  if (!any) return std::nullopt;
  if (i < s.size()) {
    if (s[i] != 'e' && s[i] != 'E') return std::nullopt;
    ++i;
    bool eneg = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) eneg = s[i++] == '-';
    if (i == s.size()) return std::nullopt;
    int64_t e = 0;
    for (; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      if (e > 100000) return std::nullopt;
      e = e * 10 + (s[i] - '0');
    }
    exp10 += eneg ? -e : e;
  }
  exp10 += 3;  // microseconds -> nanoseconds
  if (digits.empty()) return 0;
  bool round_up = false;
  if (exp10 < 0) {
    const int64_t drop = -exp10;
    if (drop > static_cast<int64_t>(digits.size())) {
      digits.clear();
    } else {
      const size_t keep = digits.size() - static_cast<size_t>(drop);
      round_up = digits[keep] >= '5';
      digits.resize(keep);
    }
  } else {
    if (exp10 + static_cast<int64_t>(digits.size()) > 19) return std::nullopt;
    digits.append(static_cast<size_t>(exp10), '0');
  }
  int64_t x = 0;
  for (char c : digits) {
    if (__builtin_mul_overflow(x, int64_t{10}, &x) || __builtin_add_overflow(x, c - '0', &x))
      return std::nullopt;
  }
  if (round_up && __builtin_add_overflow(x, int64_t{1}, &x)) return std::nullopt;
  return neg ? -x : x;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// "[0, 1, 2, ...]" (PyTorch truncates long lists with "...": the stride of the first two and the
// group size give the rest) or a JSON array.
std::vector<int32_t> parse_ranks(const json* v, int64_t group_size) {
  std::vector<int32_t> out;
  if (!v) return out;
  bool truncated = false;
  if (v->is_array()) {
    for (const auto& x : *v) {
      const auto r = as_int(&x);
      if (!r || *r < 0 || *r > std::numeric_limits<int32_t>::max()) return {};
      out.push_back(static_cast<int32_t>(*r));
    }
  } else if (v->is_string()) {
    const auto& s = v->get_ref<const std::string&>();
    truncated = s.find("...") != std::string::npos;
    int64_t cur = -1;
    for (char c : s) {
      if (c >= '0' && c <= '9') {
        cur = (cur < 0 ? 0 : cur) * 10 + (c - '0');
        if (cur > std::numeric_limits<int32_t>::max()) return {};
      } else if (cur >= 0) {
        out.push_back(static_cast<int32_t>(cur));
        cur = -1;
      }
      if (out.size() > (1u << 20)) return {};
    }
    if (cur >= 0) out.push_back(static_cast<int32_t>(cur));
  }
  if (truncated && out.size() >= 2 && group_size > static_cast<int64_t>(out.size()) &&
      group_size <= (1 << 20)) {
    const int64_t stride = int64_t{out[1]} - out[0];
    const int64_t first = out[0];
    const int64_t last = first + stride * (group_size - 1);
    if (stride > 0 && last <= std::numeric_limits<int32_t>::max()) {
      out.clear();
      for (int64_t k = 0; k < group_size; ++k)
        out.push_back(static_cast<int32_t>(first + stride * k));
    }
  }
  return out;
}

// The collective described by PyTorch's record_param_comms arguments (also copied onto NCCL
// kernels by recent versions).
struct CollArgs {
  bool present = false;  // "Collective name" given
  CollOp op = CollOp::None;
  int64_t bytes = 0;
  std::string pg;  // "Process Group Name"
  std::string pg_desc;
  std::vector<int32_t> pg_ranks;
  int64_t group_size = 0;
};

CollArgs coll_args(const json& ev, const std::string& file) {
  CollArgs a;
  const json* args = member(ev, "args");
  const json* cname = args ? member(*args, "Collective name") : nullptr;
  if (!cname || !cname->is_string()) return a;
  a.present = true;
  a.op = detail::torch_collective_op(cname->get<std::string>());
  const int64_t in = as_int(member(*args, "In msg nelems")).value_or(0);
  const int64_t out = as_int(member(*args, "Out msg nelems")).value_or(0);
  const int64_t elem = detail::dtype_bytes(as_str(member(*args, "dtype")));
  const int64_t n = std::max<int64_t>(0, std::max(in, out));
  if (__builtin_mul_overflow(n, elem, &a.bytes)) {
    throw InputError(file + ": a collective of " + std::to_string(n) + " elements: too large");
  }
  a.pg = as_str(member(*args, "Process Group Name"));
  a.pg_desc = as_str(member(*args, "Process Group Description"));
  a.group_size = as_int(member(*args, "Group size")).value_or(0);
  a.pg_ranks = parse_ranks(member(*args, "Process Group Ranks"), a.group_size);
  return a;
}

// pid/tid are numbers in Kineto files and sometimes text ("CPU functions" in PyTorch's legacy
// exporter). Numbers sort first, by value.
using Key = std::tuple<int, int64_t, std::string>;
Key key_of(const json* v) {
  if (const auto i =
          v && (v->is_number_integer() || v->is_number_unsigned()) ? as_int(v) : std::nullopt)
    return {0, *i, {}};
  return {1, 0, as_str(v)};
}
std::string key_text(const Key& k) {
  return std::get<0>(k) == 0 ? std::to_string(std::get<1>(k)) : std::get<2>(k);
}

enum class Cat {
  Kernel,
  Memcpy,
  Memset,
  GpuAnnotation,
  CpuOp,
  UserAnnotation,
  Python,
  Runtime,
  Other
};

Cat category(const json& ev) {
  const json* c = member(ev, "cat");
  if (!c) return Cat::CpuOp;  // PyTorch's legacy (non-Kineto) exporter writes no categories
  const std::string cat = lower(as_str(c));
  if (cat == "kernel") return Cat::Kernel;
  if (cat == "gpu_memcpy" || cat == "memcpy") return Cat::Memcpy;
  if (cat == "gpu_memset" || cat == "memset") return Cat::Memset;
  if (cat == "gpu_user_annotation") return Cat::GpuAnnotation;
  if (cat == "cpu_op" || cat == "operator") return Cat::CpuOp;
  if (cat == "user_annotation") return Cat::UserAnnotation;
  if (cat == "python_function") return Cat::Python;
  if (cat == "cuda_runtime" || cat == "cuda_driver" || cat == "runtime") return Cat::Runtime;
  return Cat::Other;
}

bool is_device(Cat c) {
  return c == Cat::Kernel || c == Cat::Memcpy || c == Cat::Memset || c == Cat::GpuAnnotation;
}

bool is_backend_comm(const std::string& name) {
  for (const char* p : {"gloo:", "nccl:", "mpi:", "ucc:"}) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

struct Ev {
  const json* e = nullptr;
  size_t index = 0;  // in traceEvents, for messages
  Cat cat = Cat::Other;
  std::string name;
  Key pid, tid;
  int64_t start_ns = 0, end_ns = 0;
  int32_t stream = -1;
};

// A record_param_comms call, a PyTorch backend op or a c10d op: host-side communication, not
// compute.
bool host_comm_call(const Ev& ev) {
  return ev.name == "record_param_comms" || is_backend_comm(ev.name) ||
         ev.name.rfind("c10d::", 0) == 0;
}

// One file (one rank) into the draft, in steps that run in this order: the time base, thread
// names, process groups, events, streams, the host calls device work refers to, spans.
class FileReader {
 public:
  FileReader(const json& root, const std::string& file, int32_t rank, detail::Draft& d)
      : root_(root), file_(file), rank_(rank), d_(d) {}

  void run();

 private:
  using ThreadNames = std::map<std::pair<Key, Key>, std::string>;
  // The complete events that become spans (memory samples went to the counters on the way).
  struct Events {
    std::vector<Ev> evs;
    bool device_work = false;  // kernels, copies or memsets: else a CPU-only rank
  };
  // What the host recorded that device work and collectives refer to. Points into Events::evs.
  struct HostCalls {
    std::unordered_map<int64_t, int64_t> launch_ns;  // correlation id -> launch time
    std::unordered_map<int64_t, const Ev*> comms_by_external;
    std::vector<const Ev*> comms_calls;  // record_param_comms, by start
    bool has_backend_ops = false;        // gloo:/nccl:/mpi:/ucc: ops on the host
    // Kernel work (kernel_work.hpp): the cpu_ops with recorded shapes by External id, and the
    // External id of each launch by correlation id.
    std::unordered_map<int64_t, const Ev*> shaped_ops;
    std::unordered_map<int64_t, int64_t> launch_external;
    // Kineto before PyTorch 1.13 gave launches and kernels their correlation id as External id,
    // not their operator's: then launch_external holds the innermost shaped cpu_op of the
    // launching thread open at the launch, and a kernel's own External id is not an op's.
    bool external_is_correlation = false;
  };
  // CPU-only ranks with backend ops: the k-th op of a kind takes the arguments of the k-th
  // record_param_comms call of that kind.
  struct BackendCalls {
    std::map<CollOp, std::vector<const Ev*>> calls_by_op;
    std::map<CollOp, size_t> seen;
  };

  [[noreturn]] void fail(const Ev& ev, const std::string& what) const {
    throw InputError(file_ + ": traceEvents[" + std::to_string(ev.index) + "] (\"" + ev.name +
                     "\"): " + what);
  }
  int32_t comm_for(const CollArgs& a);
  // step_span: the event is a step range (its number, -1 for a bare "step").
  void add(const Ev& ev, SpanKind kind, int64_t issue_ns, std::optional<int32_t> step_span = {},
           const CollArgs* ca = nullptr, CollOp op = CollOp::None, int64_t bytes = 0);

  const json& trace_events();
  ThreadNames thread_names(const json& events) const;
  void read_process_groups();
  Events read_events(const json& events);
  void read_memory_sample(const json& e, const Ev& ev);
  bool read_complete_event(const std::string& ph, const json& e, Ev& ev);
  void assign_streams(Events& in, const ThreadNames& names);
  HostCalls host_calls(const std::vector<Ev>& evs) const;
  static void link_launches_by_time(const std::vector<Ev>& evs, HostCalls& h);
  std::vector<char> leaf_ops(const std::vector<Ev>& evs) const;
  void add_spans(const Events& in, const HostCalls& host, const std::vector<char>& leaf);
  int64_t issue_of(const Ev& ev, const HostCalls& host) const;
  void add_kernel(const Ev& ev, const HostCalls& host);
  std::optional<int64_t> launching_op(const Ev& ev, const HostCalls& host) const;
  void attach_work(detail::DraftSpan& s, const Ev& ev, const HostCalls& host);
  void read_devices();
  void add_copy(const Ev& ev, const HostCalls& host);
  void add_host_event(const Ev& ev, bool leaf, bool device_work, const HostCalls& host,
                      BackendCalls& backend);

  const json& root_;
  const std::string& file_;
  int32_t rank_;
  detail::Draft& d_;
  int64_t base_ns_ = 0;
  // Per launching op (External id): its work (nullopt: none) and its compute kernels.
  std::unordered_map<int64_t, std::optional<OpWork>> op_work_;
  std::unordered_map<int64_t, int> op_kernels_;
};

int32_t FileReader::comm_for(const CollArgs& a) {
  if (a.pg.empty()) return -1;
  const int32_t id = d_.comm(a.pg);
  auto& c = d_.comms[static_cast<size_t>(id)];
  if (c.ranks.empty() && !a.pg_ranks.empty()) c.ranks = a.pg_ranks;
  if (c.size == 0 && a.group_size > 0 && a.group_size <= std::numeric_limits<int32_t>::max())
    c.size = static_cast<int32_t>(a.group_size);
  if (!a.pg_desc.empty() && c.name == "pg " + a.pg) c.name = a.pg_desc + " (pg " + a.pg + ")";
  return id;
}

void FileReader::add(const Ev& ev, SpanKind kind, int64_t issue_ns,
                     std::optional<int32_t> step_span, const CollArgs* ca, CollOp op,
                     int64_t bytes) {
  detail::DraftSpan s;
  s.span.rank = rank_;
  s.span.stream = ev.stream;
  s.span.kind = kind;
  s.span.name = d_.trace.strings.intern(step_span ? std::string("step") : ev.name);
  s.span.start_ns = ev.start_ns;
  s.span.end_ns = ev.end_ns;
  s.span.step = step_span ? *step_span : -1;
  s.span.bytes = bytes;
  s.span.op = op;
  s.issue_ns = issue_ns;
  if (ca && ca->present) {
    if (ca->op != CollOp::None) s.span.op = ca->op;
    if (ca->bytes > 0) s.span.bytes = ca->bytes;
    s.comm_key = comm_for(*ca);
  }
  d_.spans.push_back(s);
}

void FileReader::run() {
  const json& events = trace_events();
  const ThreadNames names = thread_names(events);
  read_process_groups();
  Events in = read_events(events);
  assign_streams(in, names);
  const HostCalls host = host_calls(in.evs);
  const std::vector<char> leaf =
      in.device_work ? std::vector<char>(in.evs.size(), 0) : leaf_ops(in.evs);
  read_devices();
  add_spans(in, host, leaf);
}

// Kineto's deviceProperties: the GPUs' names, which say the device preset calibrate fits.
void FileReader::read_devices() {
  const json* props = member(root_, "deviceProperties");
  if (!props || !props->is_array()) return;
  for (const auto& p : *props) {
    const std::string n = trim(as_str(member(p, "name")));
    if (!n.empty() && std::find(d_.devices.begin(), d_.devices.end(), n) == d_.devices.end())
      d_.devices.push_back(n);
  }
}

// The traceEvents array (the root itself in PyTorch's legacy exporter); the time base.
const json& FileReader::trace_events() {
  const json* events = root_.is_array() ? &root_ : member(root_, "traceEvents");
  if (!root_.is_array() && !root_.is_object()) {
    throw InputError(file_ + ": expected a JSON object with \"traceEvents\" (a Chrome trace)");
  }
  if (!events) throw InputError(file_ + ": no \"traceEvents\": not a Kineto / Chrome trace file");
  if (!events->is_array()) throw InputError(file_ + ": \"traceEvents\" is not an array");
  if (const json* base = member(root_, "baseTimeNanoseconds")) {
    const auto b = as_int(base);
    if (!b || *b < 0) throw InputError(file_ + ": \"baseTimeNanoseconds\" is not a time in ns");
    base_ns_ = *b;
  }
  return *events;
}

// Metadata events "thread_name", by (pid, tid).
FileReader::ThreadNames FileReader::thread_names(const json& events) const {
  ThreadNames names;
  for (const auto& e : events) {
    if (as_str(member(e, "ph")) == "M" && as_str(member(e, "name")) == "thread_name") {
      const json* args = member(e, "args");
      std::string n = trim(args ? as_str(member(*args, "name")) : std::string());
      if (!n.empty()) names[{key_of(member(e, "pid")), key_of(member(e, "tid"))}] = n;
    }
  }
  return names;
}

// distributedInfo.pg_config: the process groups, as communicators of the draft.
void FileReader::read_process_groups() {
  const json* di = member(root_, "distributedInfo");
  if (!di) return;
  const json* pgs = member(*di, "pg_config");
  if (!pgs || !pgs->is_array()) return;
  for (const auto& pg : *pgs) {
    const std::string key = as_str(member(pg, "pg_name"));
    if (key.empty()) continue;
    CollArgs a;
    a.present = true;
    a.pg = key;
    a.pg_desc = as_str(member(pg, "pg_desc"));
    a.group_size = as_int(member(pg, "pg_size")).value_or(0);
    a.pg_ranks = parse_ranks(member(pg, "ranks"), a.group_size);
    comm_for(a);
  }
}

// Complete events with their times, in file order; memory samples become counters.
FileReader::Events FileReader::read_events(const json& events) {
  Events out;
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    const std::string ph = as_str(member(e, "ph"));
    if (ph == "M") continue;
    Ev ev;
    ev.e = &e;
    ev.index = i;
    ev.name = as_str(member(e, "name"));
    if ((ph == "i" || ph == "I") && ev.name == "[memory]") {
      read_memory_sample(e, ev);
      continue;
    }
    if (!read_complete_event(ph, e, ev)) continue;
    if (ev.cat == Cat::Kernel || ev.cat == Cat::Memcpy || ev.cat == Cat::Memset)
      out.device_work = true;
    out.evs.push_back(std::move(ev));
  }
  return out;
}

// A "[memory]" instant event: the allocated total of its device type, as a counter sample.
void FileReader::read_memory_sample(const json& e, const Ev& ev) {
  const json* args = member(e, "args");
  const auto ts = us_to_ns(member(e, "ts"));
  if (!ts) fail(ev, "\"ts\" missing or not a number of microseconds");
  const auto total = args ? as_int(member(*args, "Total Allocated")) : std::nullopt;
  if (!total) {
    d_.skipped_events += 1;
    return;
  }
  const int64_t dev = args ? as_int(member(*args, "Device Type")).value_or(0) : 0;
  CounterSample c;
  c.rank = rank_;
  c.name = d_.trace.strings.intern(dev == 0   ? std::string("mem.cpu")
                                   : dev == 1 ? std::string("mem.cuda")
                                              : "mem.device" + std::to_string(dev));
  if (__builtin_add_overflow(*ts, base_ns_, &c.ts_ns)) fail(ev, "\"ts\" out of range");
  c.value = static_cast<double>(*total);
  d_.trace.counters.push_back(c);
}

// Fills the category, times and pid/tid of a complete ("X") event; false (counted as skipped) for
// an event that is not one, of a category not imported, or never closed.
bool FileReader::read_complete_event(const std::string& ph, const json& e, Ev& ev) {
  if (ph != "X" || !e.is_object()) {
    d_.skipped_events += 1;
    return false;
  }
  ev.cat = category(e);
  if (ev.cat == Cat::Other) {
    d_.skipped_events += 1;
    return false;
  }
  if (!member(e, "name") || !member(e, "name")->is_string()) fail(ev, "\"name\" is not a string");
  const auto ts = us_to_ns(member(e, "ts"));
  if (!ts) fail(ev, "\"ts\" missing or not a number of microseconds");
  const auto dur = us_to_ns(member(e, "dur"));
  if (!dur) fail(ev, "\"dur\" missing or not a number of microseconds");
  if (*dur < 0) {  // an event the profiler never closed
    d_.skipped_events += 1;
    return false;
  }
  if (__builtin_add_overflow(*ts, base_ns_, &ev.start_ns) ||
      __builtin_add_overflow(ev.start_ns, *dur, &ev.end_ns)) {
    fail(ev, "\"ts\" + \"dur\" out of range");
  }
  ev.pid = key_of(member(e, "pid"));
  ev.tid = key_of(member(e, "tid"));
  return true;
}

// Streams: device streams by (device, stream), then host threads by (pid, tid); the rank's device.
void FileReader::assign_streams(Events& in, const ThreadNames& names) {
  std::map<std::pair<Key, Key>, int32_t> dev_streams, host_streams;
  std::set<Key> devices;
  for (const auto& ev : in.evs) {
    (is_device(ev.cat) ? dev_streams : host_streams)[{ev.pid, ev.tid}] = -1;
    if (is_device(ev.cat)) devices.insert(ev.pid);
  }
  int32_t next_stream = 0;
  for (auto& [k, id] : dev_streams) {
    id = next_stream++;
    auto it = names.find(k);
    std::string name = it != names.end() ? it->second : "stream " + key_text(k.second);
    if (devices.size() > 1) name = "device " + key_text(k.first) + " " + name;
    d_.trace.streams.push_back({rank_, id, name});
  }
  for (auto& [k, id] : host_streams) {
    id = next_stream++;
    auto it = names.find(k);
    d_.trace.streams.push_back(
        {rank_, id, it != names.end() ? it->second : "thread " + key_text(k.second)});
  }
  for (auto& ev : in.evs) {
    ev.stream = (is_device(ev.cat) ? dev_streams : host_streams)[{ev.pid, ev.tid}];
  }
  RankInfo ri;
  ri.rank = rank_;
  ri.device = devices.empty() || !in.device_work ? "cpu" : "cuda:" + key_text(*devices.begin());
  d_.trace.ranks.push_back(ri);
}

// Host side: launch times by correlation id, and the record_param_comms calls.
FileReader::HostCalls FileReader::host_calls(const std::vector<Ev>& evs) const {
  HostCalls h;
  for (const auto& ev : evs) {
    const json* args = member(*ev.e, "args");
    if (ev.cat == Cat::Runtime && args) {
      if (auto c = as_int(member(*args, "correlation"))) {
        h.launch_ns.emplace(*c, ev.start_ns);
        if (auto x = as_int(member(*args, "External id"))) h.launch_external.emplace(*c, *x);
      }
    }
    if (ev.cat == Cat::CpuOp && args && member(*args, "Input Dims")) {
      if (auto x = as_int(member(*args, "External id"))) h.shaped_ops.emplace(*x, &ev);
    }
    if (ev.name == "record_param_comms" && !is_device(ev.cat)) {
      h.comms_calls.push_back(&ev);
      if (args) {
        if (auto x = as_int(member(*args, "External id"))) h.comms_by_external.emplace(*x, &ev);
      }
    }
    if (!is_device(ev.cat) && is_backend_comm(ev.name)) h.has_backend_ops = true;
  }
  std::stable_sort(h.comms_calls.begin(), h.comms_calls.end(),
                   [](const Ev* a, const Ev* b) { return a->start_ns < b->start_ns; });
  // Every launch's External id its correlation id (and there are some): the older schema.
  h.external_is_correlation = !h.launch_external.empty() &&
                              std::all_of(h.launch_external.begin(), h.launch_external.end(),
                                          [](const auto& kv) { return kv.first == kv.second; });
  if (h.external_is_correlation) link_launches_by_time(evs, h);
  return h;
}

// The older schema: each launch's operator is the innermost cpu_op with recorded shapes open on
// the launching thread (stream) when the launch started. A thread's ops nest, so one sweep over
// the thread's ops and launches in time order, with a stack of the open ops, finds it.
void FileReader::link_launches_by_time(const std::vector<Ev>& evs, HostCalls& h) {
  struct Item {
    int64_t t, end;
    int order;  // at one time: ops open before launches look for them
    const Ev* ev;
  };
  std::map<int32_t, std::vector<Item>> by_thread;
  for (const auto& [x, op] : h.shaped_ops)
    by_thread[op->stream].push_back({op->start_ns, op->end_ns, 0, op});
  for (const auto& ev : evs) {
    const json* args = member(*ev.e, "args");
    if (ev.cat == Cat::Runtime && args && as_int(member(*args, "correlation")))
      by_thread[ev.stream].push_back({ev.start_ns, ev.start_ns, 1, &ev});
  }
  h.launch_external.clear();
  for (auto& [thread, items] : by_thread) {
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      if (a.t != b.t) return a.t < b.t;
      if (a.order != b.order) return a.order < b.order;
      if (a.end != b.end) return a.end > b.end;  // the enclosing op first
      return a.ev->index < b.ev->index;          // then file order: the same on every run
    });
    std::vector<const Item*> open;
    for (const Item& it : items) {
      while (!open.empty() && open.back()->end < it.t) open.pop_back();
      if (it.order == 0) {
        open.push_back(&it);
      } else if (!open.empty()) {
        const json& args = *member(*it.ev->e, "args");
        h.launch_external[*as_int(member(args, "correlation"))] =
            *as_int(member(*member(*open.back()->ev->e, "args"), "External id"));
      }
    }
  }
}

// CPU-only ranks: a cpu_op enclosing no other cpu_op of its thread is a leaf (Compute).
std::vector<char> FileReader::leaf_ops(const std::vector<Ev>& evs) const {
  std::vector<char> leaf(evs.size(), 0);
  std::map<int32_t, std::vector<size_t>> by_stream;
  for (size_t i = 0; i < evs.size(); ++i) {
    const Ev& ev = evs[i];
    if (ev.cat != Cat::CpuOp || host_comm_call(ev) || detail::parse_step_name(ev.name)) continue;
    by_stream[ev.stream].push_back(i);
  }
  for (auto& [stream, v] : by_stream) {
    std::stable_sort(v.begin(), v.end(), [&](size_t a, size_t b) {
      return evs[a].start_ns != evs[b].start_ns ? evs[a].start_ns < evs[b].start_ns
                                                : evs[a].end_ns > evs[b].end_ns;
    });
    // An op that starts inside another op of its thread is called by it: a thread's ops nest
    // (an end past the caller's only comes from timestamps rounded to the microsecond).
    std::vector<size_t> open;
    for (size_t i : v) {
      leaf[i] = 1;
      while (!open.empty() && evs[open.back()].end_ns <= evs[i].start_ns &&
             evs[open.back()].start_ns != evs[i].start_ns)
        open.pop_back();
      if (!open.empty()) leaf[open.back()] = 0;
      open.push_back(i);
    }
  }
  return leaf;
}

// Every event as a span, in file order.
void FileReader::add_spans(const Events& in, const HostCalls& host, const std::vector<char>& leaf) {
  for (const auto& ev : in.evs)
    if (ev.cat == Cat::Kernel && !detail::nccl_kernel_op(ev.name))
      if (const auto x = launching_op(ev, host)) op_kernels_[*x] += 1;
  BackendCalls backend;
  if (!in.device_work && host.has_backend_ops) {
    for (const Ev* c : host.comms_calls)
      backend.calls_by_op[coll_args(*c->e, file_).op].push_back(c);
  }
  for (size_t i = 0; i < in.evs.size(); ++i) {
    const Ev& ev = in.evs[i];
    switch (ev.cat) {
      case Cat::Kernel:
        add_kernel(ev, host);
        break;
      case Cat::Memcpy:
      case Cat::Memset:
        add_copy(ev, host);
        break;
      case Cat::GpuAnnotation:
        add(ev, SpanKind::Phase, ev.start_ns);
        break;
      case Cat::UserAnnotation:
      case Cat::CpuOp:
      case Cat::Python:
      case Cat::Runtime:
        add_host_event(ev, leaf[i] != 0, in.device_work, host, backend);
        break;
      case Cat::Other:
        break;
    }
  }
}

// Device work belongs to the step its launch was issued in: the launch's time, else its own.
int64_t FileReader::issue_of(const Ev& ev, const HostCalls& host) const {
  const json* args = member(*ev.e, "args");
  if (args) {
    if (auto c = as_int(member(*args, "correlation"))) {
      if (auto it = host.launch_ns.find(*c); it != host.launch_ns.end()) return it->second;
    }
  }
  return ev.start_ns;
}

// A kernel: compute, or an NCCL collective with the arguments of the record_param_comms call it
// carries, that its External id names, or that was open when it was launched.
void FileReader::add_kernel(const Ev& ev, const HostCalls& host) {
  const json* args = member(*ev.e, "args");
  const int64_t issue = issue_of(ev, host);
  const auto nccl = detail::nccl_kernel_op(ev.name);
  if (!nccl) {
    add(ev, SpanKind::Compute, issue);
    attach_work(d_.spans.back(), ev, host);
    return;
  }
  CollArgs a = coll_args(*ev.e, file_);
  if (!a.present && args) {
    if (auto x = as_int(member(*args, "External id"))) {
      if (auto it = host.comms_by_external.find(*x); it != host.comms_by_external.end())
        a = coll_args(*it->second->e, file_);
    }
  }
  if (!a.present && !host.comms_calls.empty()) {
    // The record_param_comms call that was open when the kernel was launched.
    auto ub = std::upper_bound(host.comms_calls.begin(), host.comms_calls.end(), issue,
                               [](int64_t t, const Ev* c) { return t < c->start_ns; });
    if (ub != host.comms_calls.begin() && (*(ub - 1))->end_ns >= issue)
      a = coll_args(*(*(ub - 1))->e, file_);
  }
  CollOp op = a.present && a.op != CollOp::None ? a.op : *nccl;
  add(ev, detail::kind_of_op(op), issue, {}, &a, op);
}

// The External id of the op that launched a kernel: the kernel's own, else its launch's.
std::optional<int64_t> FileReader::launching_op(const Ev& ev, const HostCalls& host) const {
  const json* args = member(*ev.e, "args");
  if (!args) return std::nullopt;
  if (auto x = as_int(member(*args, "External id"));
      x && !host.external_is_correlation && host.shaped_ops.count(*x))
    return x;
  if (auto c = as_int(member(*args, "correlation"))) {
    if (auto it = host.launch_external.find(*c); it != host.launch_external.end())
      if (host.shaped_ops.count(it->second)) return it->second;
  }
  return std::nullopt;
}

// The recorded inputs of a cpu_op ("Input Dims", "Input type", "Concrete Inputs").
std::vector<OpInput> op_inputs(const json& args) {
  std::vector<OpInput> in;
  const json* dims = member(args, "Input Dims");
  const json* types = member(args, "Input type");
  const json* concrete = member(args, "Concrete Inputs");
  if (!dims || !dims->is_array()) return in;
  auto dim_list = [](const json& v, std::vector<int64_t>& out) {
    for (const auto& x : v) {
      const auto d = x.is_number() ? as_int(&x) : std::nullopt;
      if (!d) return false;
      out.push_back(*d);
    }
    return true;
  };
  for (size_t i = 0; i < dims->size(); ++i) {
    const json& v = (*dims)[i];
    OpInput x;
    if (v.is_array() && !v.empty() && v.front().is_array()) {
      x.kind = OpInput::Kind::List;
      for (const auto& t : v) {
        std::vector<int64_t> d;
        if (t.is_array() && dim_list(t, d)) x.list.push_back(std::move(d));
      }
    } else if (v.is_array() && !v.empty()) {
      x.kind = dim_list(v, x.dims) ? OpInput::Kind::Tensor : OpInput::Kind::None;
    }
    if (types && types->is_array() && i < types->size()) x.type = as_str(&(*types)[i]);
    if (concrete && concrete->is_array() && i < concrete->size())
      x.concrete = as_str(&(*concrete)[i]);
    in.push_back(std::move(x));
  }
  return in;
}

// A compute kernel whose launching op has recorded shapes: its share of the op's work.
void FileReader::attach_work(detail::DraftSpan& s, const Ev& ev, const HostCalls& host) {
  const auto x = launching_op(ev, host);
  if (!x) return;
  auto it = op_work_.find(*x);
  if (it == op_work_.end()) {
    const Ev* op = host.shaped_ops.at(*x);
    const json* args = member(*op->e, "args");
    it = op_work_.emplace(*x, args ? op_work(op->name, op_inputs(*args)) : std::nullopt).first;
  }
  if (!it->second) return;
  const double share = 1.0 / std::max(1, op_kernels_[*x]);
  s.span.flops = it->second->flops * share;
  s.span.bytes = static_cast<int64_t>(std::llround(it->second->bytes * share));
  KernelWork k;
  k.group = *x;
  k.op = host.shaped_ops.at(*x)->name;
  k.work = *it->second;
  s.work = static_cast<int32_t>(d_.works.size());
  d_.works.push_back(std::move(k));
}

void FileReader::add_copy(const Ev& ev, const HostCalls& host) {
  const json* args = member(*ev.e, "args");
  const int64_t issue = issue_of(ev, host);
  const int64_t bytes = args ? std::max<int64_t>(0, as_int(member(*args, "bytes")).value_or(0)) : 0;
  add(ev, SpanKind::Memcpy, issue, {}, nullptr, CollOp::None, bytes);
}

// A host event: a step range, an annotation, or on CPU-only ranks a collective (backend op or
// record_param_comms) or a leaf op (compute); anything else is Other.
void FileReader::add_host_event(const Ev& ev, bool leaf, bool device_work, const HostCalls& host,
                                BackendCalls& backend) {
  if (const auto step = detail::parse_step_name(ev.name);
      step && (ev.cat == Cat::UserAnnotation || ev.name.rfind("ProfilerStep#", 0) == 0)) {
    add(ev, SpanKind::Phase, ev.start_ns, *step);
    return;
  }
  if (ev.cat == Cat::UserAnnotation) {
    add(ev, SpanKind::Phase, ev.start_ns);
    return;
  }
  if (!device_work && ev.cat == Cat::CpuOp) {
    if (host.has_backend_ops && is_backend_comm(ev.name)) {
      const CollOp op = detail::torch_collective_op(ev.name);
      CollArgs a = coll_args(*ev.e, file_);
      auto& seen = backend.seen[op];
      auto it = backend.calls_by_op.find(op);
      if (!a.present && it != backend.calls_by_op.end() && seen < it->second.size())
        a = coll_args(*it->second[seen]->e, file_);
      ++seen;
      add(ev, detail::kind_of_op(op), ev.start_ns, {}, &a, op);
      return;
    }
    if (!host.has_backend_ops && ev.name == "record_param_comms") {
      const CollArgs a = coll_args(*ev.e, file_);
      add(ev, detail::kind_of_op(a.op), ev.start_ns, {}, &a, a.op);
      return;
    }
    if (leaf) {
      add(ev, SpanKind::Compute, ev.start_ns);
      return;
    }
  }
  add(ev, SpanKind::Other, ev.start_ns);
}

struct FileInfo {
  int32_t rank = -1;
  int32_t world = 0;
  bool has_base = false;
};

FileInfo file_info(const json& root, const std::string& file) {
  FileInfo fi;
  const json* di = member(root, "distributedInfo");
  if (di && di->is_object()) {
    if (const json* r = member(*di, "rank")) {
      const auto v = as_int(r);
      if (!v || *v < 0 || *v > (1 << 24)) {
        throw InputError(file + ": distributedInfo.rank is not a rank number (" + r->dump() + ")");
      }
      fi.rank = static_cast<int32_t>(*v);
    }
    if (const json* w = member(*di, "world_size")) {
      const auto v = as_int(w);
      if (!v || *v < 1 || *v > (1 << 24)) {
        throw InputError(file + ": distributedInfo.world_size is not a positive count (" +
                         w->dump() + ")");
      }
      fi.world = static_cast<int32_t>(*v);
    }
  }
  fi.has_base = member(root, "baseTimeNanoseconds") != nullptr;
  return fi;
}

}  // namespace

Trace import_kineto_texts(const std::vector<std::string_view>& texts,
                          const std::vector<std::string>& names) {
  if (texts.size() != names.size())
    throw InternalError("import_kineto_texts: texts and names differ in count");
  if (texts.empty()) throw InputError("import kineto: no input files");
  detail::Draft d;
  d.format = ImportFormat::Kineto;
  d.files = names;
  std::map<int32_t, std::string> rank_files;
  bool all_base = true;
  std::vector<json> roots;
  std::vector<FileInfo> infos;
  roots.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    roots.push_back(parse_json(texts[i], names[i]));
    if (!roots.back().is_object() && !roots.back().is_array())
      throw InputError(names[i] + ": expected a JSON object with \"traceEvents\" (a Chrome trace)");
    infos.push_back(file_info(roots.back(), names[i]));
  }
  // Files without distributedInfo take their position, skipping ranks other files claim.
  std::set<int32_t> claimed;
  for (const auto& fi : infos) {
    if (fi.rank >= 0) claimed.insert(fi.rank);
  }
  int32_t next = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    auto& fi = infos[i];
    if (fi.rank < 0) {
      while (claimed.count(next)) ++next;
      fi.rank = next++;
    }
    auto [it, inserted] = rank_files.emplace(fi.rank, names[i]);
    if (!inserted) {
      throw InputError(names[i] + ": rank " + std::to_string(fi.rank) + " again (also " +
                       it->second + ")");
    }
    d.world_size = std::max(d.world_size, fi.world);
    all_base = all_base && fi.has_base;
    FileReader(roots[i], names[i], fi.rank, d).run();
    roots[i] = json();  // free the DOM early
  }
  int64_t earliest = std::numeric_limits<int64_t>::max();
  for (const auto& s : d.spans) earliest = std::min(earliest, s.span.start_ns);
  // baseTimeNanoseconds makes times Unix times; so does a Kineto file of old writing epoch us.
  if (all_base || (earliest != std::numeric_limits<int64_t>::max() &&
                   earliest >= int64_t{1'000'000'000'000'000'000}))
    d.unix_origin_ns = 0;
  return detail::finish_import(std::move(d));
}

Trace import_kineto(const std::vector<std::string>& files) {
  std::vector<std::string> texts;
  texts.reserve(files.size());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw InputError(f + ": cannot open");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw InputError(f + ": cannot read");
    texts.push_back(std::move(ss).str());
  }
  std::vector<std::string_view> views(texts.begin(), texts.end());
  return import_kineto_texts(views, files);
}

}  // namespace orrery::traces
