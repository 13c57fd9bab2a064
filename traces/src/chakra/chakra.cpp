// Chakra execution traces through protobuf (traces/chakra.hpp; the span-to-node mapping is in
// traces/README.md). The writer frames each message with its varint length as Chakra's tools do;
// the reader undoes that framing itself, so that a damaged file is reported by file, message index
// and byte offset rather than as a failed parse of the whole.
#include "orrery/traces/chakra.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "chakra_et.pb.h"
#include "orrery/common/atomic_file.hpp"
#include "orrery/common/crc32c.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/meta_json.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::traces {

namespace fs = std::filesystem;
namespace pb = ChakraProtoMsg;
using json = nlohmann::json;

bool chakra_available() { return true; }

namespace {

// The Chakra schema version our files declare (the one the published schema carries).
constexpr const char* kChakraVersion = "0.0.4";
// Version of Orrery's own attributes (orrery.*); a reader refuses a later one.
constexpr int64_t kOrreryChakraFormat = 1;

// ---- attributes

pb::AttributeProto* add_attr(google::protobuf::RepeatedPtrField<pb::AttributeProto>* attrs,
                             const char* name) {
  pb::AttributeProto* a = attrs->Add();
  a->set_name(name);
  return a;
}
void attr_i64(pb::Node& n, const char* name, int64_t v) {
  add_attr(n.mutable_attr(), name)->set_int64_val(v);
}
void attr_i32(pb::Node& n, const char* name, int32_t v) {
  add_attr(n.mutable_attr(), name)->set_int32_val(v);
}
void attr_u64(pb::Node& n, const char* name, uint64_t v) {
  add_attr(n.mutable_attr(), name)->set_uint64_val(v);
}
void attr_dbl(pb::Node& n, const char* name, double v) {
  add_attr(n.mutable_attr(), name)->set_double_val(v);
}
void attr_str(pb::Node& n, const char* name, const std::string& v) {
  add_attr(n.mutable_attr(), name)->set_string_val(v);
}
void attr_bool(pb::Node& n, const char* name, bool v) {
  add_attr(n.mutable_attr(), name)->set_bool_val(v);
}

// Nearest microsecond of a time in ns (Chakra's fields are unsigned: negative times are 0).
uint64_t micros(int64_t ns) {
  if (ns <= 0) return 0;
  return static_cast<uint64_t>(ns / 1000 + (ns % 1000 >= 500 ? 1 : 0));
}

std::optional<int64_t> chakra_comm_type(CollOp op) {
  switch (op) {
    case CollOp::AllReduce:
      return pb::ALL_REDUCE;
    case CollOp::Reduce:
      return pb::REDUCE;
    case CollOp::AllGather:
      return pb::ALL_GATHER;
    case CollOp::Broadcast:
      return pb::BROADCAST;
    case CollOp::AllToAll:
      return pb::ALL_TO_ALL;
    case CollOp::ReduceScatter:
      return pb::REDUCE_SCATTER;
    case CollOp::Barrier:
      return pb::BARRIER;
    default:
      return std::nullopt;
  }
}

// Chakra's collectives Orrery has no op for (GATHER, SCATTER) map to None.
CollOp op_of_comm_type(int64_t t) {
  switch (t) {
    case pb::ALL_REDUCE:
      return CollOp::AllReduce;
    case pb::REDUCE:
      return CollOp::Reduce;
    case pb::ALL_GATHER:
      return CollOp::AllGather;
    case pb::BROADCAST:
      return CollOp::Broadcast;
    case pb::ALL_TO_ALL:
      return CollOp::AllToAll;
    case pb::REDUCE_SCATTER:
    case pb::REDUCE_SCATTER_BLOCK:
      return CollOp::ReduceScatter;
    case pb::BARRIER:
      return CollOp::Barrier;
    default:
      return CollOp::None;
  }
}

pb::NodeType node_type_of(const Span& s) {
  switch (s.kind) {
    case SpanKind::Phase:
      return pb::METADATA_NODE;
    case SpanKind::Collective:
      return pb::COMM_COLL_NODE;
    case SpanKind::P2P:
      return s.op == CollOp::Recv ? pb::COMM_RECV_NODE : pb::COMM_SEND_NODE;
    default:
      return pb::COMP_NODE;  // compute, optimizer, data, memcpy, other: timed work
  }
}

// ---- framing

void append_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void append_message(std::string& out, const google::protobuf::Message& m, const std::string& file) {
  std::string body;
  if (!m.SerializeToString(&body))
    throw InternalError(file + ": protobuf could not serialise a message");
  append_varint(out, body.size());
  out += body;
}

// Orrery's messages end with the attribute orrery.crc32c: the CRC32C of the message serialised
// without it. A changed byte anywhere in a message is then an error on import, not a wrong value.
template <class M>
void seal(M& m) {
  const std::string body = m.SerializeAsString();
  add_attr(m.mutable_attr(), "orrery.crc32c")->set_uint32_val(crc32c(body.data(), body.size()));
}

template <class M>
void check_seal(const M& m, const std::string& where) {
  if (m.attr_size() == 0 || m.attr(m.attr_size() - 1).name() != "orrery.crc32c")
    throw InputError(where +
                     ": its last attribute is not orrery.crc32c, which Orrery writes last (a "
                     "damaged or edited file)");
  const auto& a = m.attr(m.attr_size() - 1);
  if (a.value_case() != pb::AttributeProto::kUint32Val)
    throw InputError(where + ": attribute 'orrery.crc32c' is not of type uint32");
  M copy = m;
  copy.mutable_attr()->RemoveLast();
  const std::string body = copy.SerializeAsString();
  const uint32_t want = crc32c(body.data(), body.size());
  if (want != a.uint32_val()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%08x, its bytes give %08x", a.uint32_val(), want);
    throw InputError(where + ": checksum mismatch (orrery.crc32c " + buf +
                     "): a damaged or edited file");
  }
}

// The length of the well-formed UTF-8 sequence at s[i], 0 when there is none (overlong forms,
// surrogates and code points beyond U+10FFFF are not UTF-8).
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if ((c >> 5) == 0x6) {
    len = 2, cp = c & 0x1f;
  } else if ((c >> 4) == 0xe) {
    len = 3, cp = c & 0x0f;
  } else if ((c >> 3) == 0x1e) {
    len = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto d = static_cast<uint8_t>(s[i + k]);
    if ((d >> 6) != 0x2) return 0;
    cp = (cp << 6) | (d & 0x3f);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
      (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
    return 0;
  return len;
}

// `s` as protobuf's proto3 strings must be, UTF-8: each byte that is not becomes U+FFFD.
// Sets `changed` when any was.
std::string as_utf8(std::string_view s, bool& changed) {
  std::string out;
  out.reserve(s.size());
  changed = false;
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      changed = true;
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

std::string rank_file_name(const std::string& prefix, int32_t rank) {
  return prefix + "." + std::to_string(rank) + ".et";
}

// ---- metadata as JSON (exact: integers as integers, doubles with round-trip precision)

json meta_json(const Trace& t, const std::vector<int32_t>& exported) {
  json j;
  const RunMeta& m = t.meta;
  j["source"] = std::string(to_string(m.source));
  j["scenario_text"] = m.scenario_text;
  j["scenario_name"] = m.scenario_name;
  j["host"] = m.host;
  j["start_time_unix_ns"] = m.start_time_unix_ns;
  j["world_size"] = m.world_size;
  j["dp"] = m.dp;
  j["tp"] = m.tp;
  j["pp"] = m.pp;
  j["tokens_per_step"] = m.tokens_per_step;
  j["model_flops_per_step"] = m.model_flops_per_step;
  j["peak_flops_per_rank"] = m.peak_flops_per_rank;
  j["extra_json"] = m.extra_json;
  j["origin"] = std::string(to_string(m.origin));
  j["layout"] = m.layout;
  j["failure"] = m.failure;
  j["exported_ranks"] = exported;
  j["ranks"] = json::array();
  for (const auto& r : t.ranks)
    j["ranks"].push_back({{"rank", r.rank},
                          {"host", r.host},
                          {"device", r.device},
                          {"dp", r.dp},
                          {"tp", r.tp},
                          {"pp", r.pp}});
  j["streams"] = json::array();
  for (const auto& s : t.streams)
    j["streams"].push_back({{"rank", s.rank}, {"stream", s.stream}, {"name", s.name}});
  j["communicators"] = json::array();
  for (const auto& c : t.comms)
    j["communicators"].push_back({{"id", c.id},
                                  {"kind", std::string(to_string(c.kind))},
                                  {"name", c.name},
                                  {"ranks", c.ranks}});
  return j;
}

// ---- reading: one file's messages

struct RankFile {
  std::string path;
  int32_t rank = -1;
  pb::GlobalMetadata meta;
  std::vector<pb::Node> nodes;  // in file order; message index = position + 1
  bool orrery = false;          // written by Orrery (orrery.format present)
};

// "<file>: message K (node id N 'name')" for messages about a node.
std::string where(const RankFile& f, size_t node_pos) {
  const pb::Node& n = f.nodes[node_pos];
  return f.path + ": message " + std::to_string(node_pos + 1) + " (node id " +
         std::to_string(n.id()) + (n.name().empty() ? "" : " '" + n.name() + "'") + ")";
}

std::string read_whole(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw InputError(path + ": no such Chakra file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read failed");
  return ss.str();
}

// The rank in a name "<prefix>.<rank>.et", or -1.
int32_t rank_from_name(const std::string& path) {
  static const std::regex kName(R"(.*\.([0-9]{1,9})\.et$)");
  std::smatch m;
  const std::string name = fs::path(path).filename().string();
  if (!std::regex_match(name, m, kName)) return -1;
  return std::stoi(m[1].str());
}

// Splits a file into its length-prefixed messages, parsing the first as GlobalMetadata and the
// rest as Nodes.
RankFile read_rank_file(const std::string& path) {
  RankFile f;
  f.path = path;
  f.rank = rank_from_name(path);
  const std::string bytes = read_whole(path);
  if (bytes.empty())
    throw InputError(path + ": empty file, expected a Chakra GlobalMetadata message first");
  size_t pos = 0;
  for (size_t index = 0; pos < bytes.size(); ++index) {
    const size_t at = pos;
    uint64_t len = 0;
    int shift = 0;
    bool done = false;
    while (pos < bytes.size() && shift < 64) {
      const auto b = static_cast<uint8_t>(bytes[pos++]);
      len |= uint64_t(b & 0x7f) << shift;
      shift += 7;
      if (!(b & 0x80)) {
        done = true;
        break;
      }
    }
    if (!done) {
      throw InputError(path + ": message " + std::to_string(index) + " at byte " +
                       std::to_string(at) + ": its length prefix is not a valid varint" +
                       (pos >= bytes.size() ? " (the file ends inside it: truncated?)" : ""));
    }
    if (len > bytes.size() - pos) {
      throw InputError(path + ": message " + std::to_string(index) + " at byte " +
                       std::to_string(at) + ": its length prefix says " + std::to_string(len) +
                       " bytes but only " + std::to_string(bytes.size() - pos) +
                       " remain (truncated or corrupt file)");
    }
    const char* data = bytes.data() + pos;
    if (len > uint64_t(INT32_MAX))
      throw InputError(path + ": message " + std::to_string(index) + " at byte " +
                       std::to_string(at) + ": its length prefix says " + std::to_string(len) +
                       " bytes, more than protobuf reads in one message (2 GiB)");
    const int n = static_cast<int>(len);
    // protobuf logs what it dislikes (invalid UTF-8) to stderr; the error below says it.
    const google::protobuf::LogSilencer quiet;
    bool ok;
    if (index == 0) {
      ok = f.meta.ParseFromArray(data, n);
    } else {
      f.nodes.emplace_back();
      ok = f.nodes.back().ParseFromArray(data, n);
    }
    if (!ok) {
      throw InputError(path + ": message " + std::to_string(index) + " at byte " +
                       std::to_string(at) + " (" + std::to_string(len) +
                       " bytes): not a valid Chakra " + (index == 0 ? "GlobalMetadata" : "Node") +
                       " message (protobuf cannot parse it)");
    }
    pos += len;
  }
  return f;
}

// Typed access to attributes, refusing the wrong type.
class Attrs {
 public:
  Attrs(const google::protobuf::RepeatedPtrField<pb::AttributeProto>& attrs, std::string where)
      : where_(std::move(where)) {
    for (const auto& a : attrs) by_name_.emplace(a.name(), &a);
  }
  bool has(const std::string& name) const { return by_name_.count(name) > 0; }
  std::optional<int64_t> i64(const std::string& name) const {
    return get<int64_t>(name, pb::AttributeProto::kInt64Val, "int64",
                        [](const auto& a) { return a.int64_val(); });
  }
  std::optional<int32_t> i32(const std::string& name) const {
    return get<int32_t>(name, pb::AttributeProto::kInt32Val, "int32",
                        [](const auto& a) { return a.int32_val(); });
  }
  std::optional<uint64_t> u64(const std::string& name) const {
    return get<uint64_t>(name, pb::AttributeProto::kUint64Val, "uint64",
                         [](const auto& a) { return a.uint64_val(); });
  }
  std::optional<double> dbl(const std::string& name) const {
    return get<double>(name, pb::AttributeProto::kDoubleVal, "double",
                       [](const auto& a) { return a.double_val(); });
  }
  std::optional<bool> boolean(const std::string& name) const {
    return get<bool>(name, pb::AttributeProto::kBoolVal, "bool",
                     [](const auto& a) { return a.bool_val(); });
  }
  std::optional<std::string> bytes(const std::string& name) const {
    return get<std::string>(name, pb::AttributeProto::kBytesVal, "bytes",
                            [](const auto& a) { return a.bytes_val(); });
  }
  std::optional<std::string> str(const std::string& name) const {
    return get<std::string>(name, pb::AttributeProto::kStringVal, "string",
                            [](const auto& a) { return a.string_val(); });
  }

 private:
  template <class T, class F>
  std::optional<T> get(const std::string& name, pb::AttributeProto::ValueCase want,
                       const char* type, F value) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return std::nullopt;
    if (it->second->value_case() != want)
      throw InputError(where_ + ": attribute '" + name + "' is not of type " + type);
    return value(*it->second);
  }
  std::string where_;
  std::unordered_map<std::string, const pb::AttributeProto*> by_name_;
};

// Checks ids and dependencies of one file: unique ids, every dependency a node of the file.
void check_graph(const RankFile& f) {
  std::unordered_map<uint64_t, size_t> pos;
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    auto [it, inserted] = pos.emplace(f.nodes[i].id(), i);
    if (!inserted)
      throw InputError(where(f, i) + ": node id " + std::to_string(f.nodes[i].id()) +
                       " already used by message " + std::to_string(it->second + 1));
  }
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    const pb::Node& n = f.nodes[i];
    for (const auto* deps : {&n.data_deps(), &n.ctrl_deps()}) {
      for (const uint64_t d : *deps) {
        if (!pos.count(d))
          throw InputError(where(f, i) + ": " + (deps == &n.data_deps() ? "data" : "control") +
                           " dependency on node id " + std::to_string(d) +
                           ", which the file does not have");
        if (d == n.id()) throw InputError(where(f, i) + ": the node depends on itself");
      }
    }
    if (n.type() < pb::INVALID_NODE || n.type() > pb::CHECKPOINT_NODE)
      throw InputError(where(f, i) + ": node type " + std::to_string(int(n.type())) +
                       " is not one of Chakra's (0 to 10)");
  }
}

// "P" of a file "P.<rank>.et" (the file itself when it is not named so).
std::string prefix_of(const RankFile& f) {
  const std::string suffix = "." + std::to_string(f.rank) + ".et";
  if (f.path.size() > suffix.size() &&
      f.path.compare(f.path.size() - suffix.size(), suffix.size(), suffix) == 0)
    return f.path.substr(0, f.path.size() - suffix.size());
  return f.path;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (const int32_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

SpanKind span_kind_of_node(pb::NodeType t) {
  switch (t) {
    case pb::COMP_NODE:
      return SpanKind::Compute;
    case pb::COMM_COLL_NODE:
      return SpanKind::Collective;
    case pb::COMM_SEND_NODE:
    case pb::COMM_RECV_NODE:
      return SpanKind::P2P;
    case pb::METADATA_NODE:
      return SpanKind::Phase;
    case pb::MEM_LOAD_NODE:
    case pb::MEM_STORE_NODE:
      return SpanKind::Memcpy;
    default:
      return SpanKind::Other;
  }
}

// A node of a file not written by Orrery, with what Chakra says.
struct ForeignNode {
  size_t pos = 0;  // in its file
  Span span;
  std::string pg_name;
  bool has_pg = false;
};

// Start times for a file whose nodes all start at 0 (Chakra's converters often leave them so):
// each node starts when the last of its dependencies ended (and, on its stream, the node before).
void schedule_as_soon_as_possible(const RankFile& f, std::vector<ForeignNode>& nodes) {
  std::unordered_map<uint64_t, size_t> pos;
  for (size_t i = 0; i < f.nodes.size(); ++i) pos[f.nodes[i].id()] = i;
  std::vector<int32_t> indegree(nodes.size(), 0);
  std::vector<std::vector<size_t>> children(nodes.size());
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    for (const auto* deps : {&f.nodes[i].data_deps(), &f.nodes[i].ctrl_deps()})
      for (const uint64_t d : *deps) {
        children[pos[d]].push_back(i);
        indegree[i]++;
      }
  }
  std::vector<size_t> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (indegree[i] == 0) ready.push_back(i);
  std::map<int32_t, int64_t> stream_free;
  size_t done = 0;
  // In file order among the ready nodes: Chakra files list a rank's program in order.
  std::set<size_t> queue(ready.begin(), ready.end());
  std::vector<int64_t> earliest(nodes.size(), 0);
  while (!queue.empty()) {
    const size_t i = *queue.begin();
    queue.erase(queue.begin());
    Span& s = nodes[i].span;
    const int64_t dur = s.end_ns - s.start_ns;
    s.start_ns = std::max(earliest[i], stream_free[s.stream]);
    if (__builtin_add_overflow(s.start_ns, dur, &s.end_ns))
      throw InputError(where(f, i) +
                       ": scheduled after its dependencies it would end beyond 2^63 ns");
    if (s.kind != SpanKind::Phase) stream_free[s.stream] = s.end_ns;
    ++done;
    for (const size_t c : children[i]) {
      earliest[c] = std::max(earliest[c], s.end_ns);
      if (--indegree[c] == 0) queue.insert(c);
    }
  }
  if (done != nodes.size())
    throw InputError(f.path + ": the nodes' dependencies form a cycle (" +
                     std::to_string(nodes.size() - done) + " nodes never become ready)");
}

// The span of a node of an Orrery file: every field from its orrery.* attributes, checked against
// the Chakra fields they were written beside.
Span orrery_span(const RankFile& f, size_t i, Trace& t) {
  const pb::Node& n = f.nodes[i];
  const std::string w = where(f, i);
  const Attrs a(n.attr(), w);
  auto need_i64 = [&](const char* name) {
    auto v = a.i64(name);
    if (!v)
      throw InputError(w + ": attribute '" + std::string(name) +
                       "' is missing (Orrery writes it on every node)");
    return *v;
  };
  Span s;
  s.rank = f.rank;
  // A name that was not valid UTF-8 (proto3 strings must be) is kept exactly in orrery.name.
  if (auto raw = a.bytes("orrery.name")) {
    s.name = t.strings.intern(*raw);
  } else {
    s.name = t.strings.intern(n.name());
  }
  const auto kind_name = a.str("orrery.kind");
  if (!kind_name)
    throw InputError(w + ": attribute 'orrery.kind' is missing (Orrery writes it on every node)");
  const auto kind = span_kind_from_string(*kind_name);
  if (!kind)
    throw InputError(w + ": attribute 'orrery.kind' is '" + *kind_name + "', not a span kind");
  s.kind = *kind;
  const auto stream = a.i32("orrery.stream");
  if (!stream)
    throw InputError(w + ": attribute 'orrery.stream' is missing (Orrery writes it on every node)");
  s.stream = *stream;
  s.start_ns = need_i64("orrery.start_ns");
  const int64_t dur = need_i64("orrery.duration_ns");
  if (__builtin_add_overflow(s.start_ns, dur, &s.end_ns))
    throw InputError(w + ": orrery.start_ns + orrery.duration_ns overflows int64");
  if (micros(s.start_ns) != n.start_time_micros() || micros(dur) != n.duration_micros())
    throw InputError(w + ": start_time_micros " + std::to_string(n.start_time_micros()) +
                     " / duration_micros " + std::to_string(n.duration_micros()) +
                     " disagree with orrery.start_ns " + std::to_string(s.start_ns) +
                     " / orrery.duration_ns " + std::to_string(dur) +
                     " (a damaged or edited file)");
  if (auto v = a.i32("orrery.step")) s.step = *v;
  if (auto v = a.i32("orrery.micro_batch")) s.micro_batch = *v;
  if (auto v = a.i32("orrery.layer")) s.layer = *v;
  if (auto v = a.dbl("orrery.flops")) s.flops = *v;
  if (auto v = a.i32("orrery.comm")) s.comm = *v;
  if (auto v = a.i32("orrery.peer")) s.peer = *v;
  if (auto v = a.i64("orrery.seq")) s.seq = *v;
  if (auto v = a.str("orrery.op")) {
    const auto op = coll_op_from_string(*v);
    if (!op) throw InputError(w + ": attribute 'orrery.op' is '" + *v + "', not an operation");
    s.op = *op;
  }
  if (node_type_of(s) != n.type())
    throw InputError(w + ": node type " + std::string(pb::NodeType_Name(n.type())) +
                     " does not fit its orrery.kind '" + *kind_name + "' and orrery.op '" +
                     std::string(to_string(s.op)) + "'");
  const bool comm = n.type() == pb::COMM_COLL_NODE || n.type() == pb::COMM_SEND_NODE ||
                    n.type() == pb::COMM_RECV_NODE;
  if (comm) {
    s.bytes = a.i64("comm_size").value_or(0);
  } else if (auto v = a.u64("tensor_size")) {
    if (*v > uint64_t(INT64_MAX)) throw InputError(w + ": tensor_size exceeds int64");
    s.bytes = static_cast<int64_t>(*v);
  }
  return s;
}

}  // namespace

std::vector<std::string> chakra_input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& in : inputs) {
    if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
      continue;
    }
    const fs::path p(in);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    const std::string base = p.filename().string();
    std::vector<std::pair<int32_t, std::string>> found;
    if (fs::is_directory(dir, ec)) {
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.size() <= base.size() + 4 || name.compare(0, base.size() + 1, base + ".") != 0)
          continue;
        const std::string rest = name.substr(base.size() + 1);
        if (rest.size() < 4 || rest.compare(rest.size() - 3, 3, ".et") != 0) continue;
        const std::string digits = rest.substr(0, rest.size() - 3);
        if (digits.empty() || digits.size() > 9 ||
            !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
          continue;
        found.emplace_back(std::stoi(digits), (p.has_parent_path() ? (dir / name).string() : name));
      }
    }
    if (found.empty())
      throw InputError(in + ": no such file, and no Chakra files " + in + ".<rank>.et beside it");
    std::sort(found.begin(), found.end());
    for (auto& [r, f] : found) files.push_back(f);
  }
  return files;
}

namespace {

// Send/receive tags: the k-th transfer of a flow (communicator, source, destination) in the
// rank's recorded order, stream by stream (how replay pairs them), is tag k on both sides.
std::vector<int32_t> p2p_tags(std::span<const Span> spans) {
  std::vector<int32_t> tag(spans.size(), -1);
  std::vector<size_t> p2p;
  for (size_t i = 0; i < spans.size(); ++i)
    if (spans[i].kind == SpanKind::P2P) p2p.push_back(i);
  std::stable_sort(p2p.begin(), p2p.end(), [&](size_t a, size_t b) {
    const Span &x = spans[a], &y = spans[b];
    return std::tie(x.stream, x.start_ns, x.end_ns) < std::tie(y.stream, y.start_ns, y.end_ns);
  });
  std::map<std::tuple<int32_t, int32_t, int32_t>, int32_t> next;  // (comm, peer, is recv)
  for (const size_t i : p2p) {
    const Span& s = spans[i];
    tag[i] = next[{s.comm, s.peer, s.op == CollOp::Recv ? 1 : 0}]++;
  }
  return tag;
}

// A node's times and attributes: what ASTRA-sim reads, then Orrery's own (the span exactly).
void node_attributes(pb::Node& n, const Span& s, int32_t rank, int32_t tag,
                     ChakraExportSummary& sum) {
  n.set_start_time_micros(micros(s.start_ns));
  n.set_duration_micros(micros(s.end_ns - s.start_ns));
  // What ASTRA-sim reads.
  attr_bool(n, "is_cpu_op", false);
  if (n.type() == pb::COMP_NODE) {
    if (s.flops > 0) attr_i64(n, "num_ops", std::llround(s.flops));
    if (s.bytes > 0) attr_u64(n, "tensor_size", static_cast<uint64_t>(s.bytes));
  } else if (n.type() != pb::METADATA_NODE) {
    sum.comm_nodes++;
    if (n.type() == pb::COMM_COLL_NODE) {
      if (auto ct = chakra_comm_type(s.op)) attr_i64(n, "comm_type", *ct);
    } else {
      const bool recv = n.type() == pb::COMM_RECV_NODE;
      attr_i32(n, "comm_src", recv ? s.peer : rank);
      attr_i32(n, "comm_dst", recv ? rank : s.peer);
      attr_i32(n, "comm_tag", tag);
    }
    attr_i64(n, "comm_size", s.bytes);
    if (s.comm >= 0) attr_str(n, "pg_name", std::to_string(s.comm));
  } else {
    sum.phase_nodes++;
  }
  // Orrery's own: the span exactly.
  attr_str(n, "orrery.kind", std::string(to_string(s.kind)));
  attr_i32(n, "orrery.stream", s.stream);
  attr_i64(n, "orrery.start_ns", s.start_ns);
  attr_i64(n, "orrery.duration_ns", s.end_ns - s.start_ns);
  if (s.op != CollOp::None) attr_str(n, "orrery.op", std::string(to_string(s.op)));
  if (s.step != -1) attr_i32(n, "orrery.step", s.step);
  if (s.micro_batch != -1) attr_i32(n, "orrery.micro_batch", s.micro_batch);
  if (s.layer != -1) attr_i32(n, "orrery.layer", s.layer);
  if (s.flops != 0) attr_dbl(n, "orrery.flops", s.flops);
  if (s.comm != -1) attr_i32(n, "orrery.comm", s.comm);
  if (s.peer != -1) attr_i32(n, "orrery.peer", s.peer);
  if (s.seq != -1) attr_i64(n, "orrery.seq", s.seq);
}

// The GlobalMetadata of a rank's file: the format, the rank, the trace's meta and its counters.
void append_global_metadata(std::string& bytes, int32_t rank, const std::string& meta_text,
                            const Trace& header, std::span<const CounterSample> counters,
                            const std::string& path) {
  pb::GlobalMetadata gm;
  gm.set_version(kChakraVersion);
  add_attr(gm.mutable_attr(), "orrery.format")->set_int64_val(kOrreryChakraFormat);
  add_attr(gm.mutable_attr(), "orrery.rank")->set_int32_val(rank);
  add_attr(gm.mutable_attr(), "orrery.meta")->set_string_val(meta_text);
  json j = json::array();
  for (const auto& c : counters)
    j.push_back(json::array({header.strings.str(c.name), c.ts_ns, c.value}));
  add_attr(gm.mutable_attr(), "orrery.counters")
      ->set_string_val(j.dump(-1, ' ', false, json::error_handler_t::replace));
  seal(gm);
  append_message(bytes, gm, path);
}

// One rank's file: its spans (in the trace's order; a node's id is its position there) and its
// counter samples (in the trace's order), with the names of `header`.
std::string rank_file_bytes(const Trace& header, int32_t rank, std::span<const Span> spans,
                            std::span<const CounterSample> counters, const std::string& meta_text,
                            const std::string& path, ChakraExportSummary& sum) {
  std::string bytes;
  append_global_metadata(bytes, rank, meta_text, header, counters, path);
  const std::vector<SpanDependencies> deps = span_dependencies(spans);
  const std::vector<int32_t> tag = p2p_tags(spans);
  // File order: by (start, end, id), an order in which every dependency comes first.
  std::vector<size_t> order(spans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Span &x = spans[a], &y = spans[b];
    return std::tie(x.start_ns, x.end_ns, a) < std::tie(y.start_ns, y.end_ns, b);
  });
  pb::Node n;
  for (const size_t i : order) {
    const Span& s = spans[i];
    n.Clear();
    n.set_id(i);
    const std::string& name = header.strings.str(s.name);
    bool changed = false;
    n.set_name(as_utf8(name, changed));
    if (changed) add_attr(n.mutable_attr(), "orrery.name")->set_bytes_val(name);
    n.set_type(node_type_of(s));
    for (const int64_t d : {deps[i].pred, deps[i].cross}) {
      if (d < 0) continue;
      n.add_data_deps(static_cast<uint64_t>(d));
      sum.data_deps++;
    }
    node_attributes(n, s, rank, tag[i], sum);
    seal(n);
    append_message(bytes, n, path);
    sum.nodes++;
    sum.nodes_by_rank[rank]++;
  }
  return bytes;
}

// The files of an export, renamed into place together when all are whole.
class ExportFiles {
 public:
  explicit ExportFiles(ChakraExportSummary& sum) : sum_(sum) {}
  void add(const std::string& path, const std::string& bytes) {
    auto f = std::make_unique<AtomicFile>(path);
    f->write(bytes);
    outs_.push_back(std::move(f));
    sum_.files.push_back(path);
  }
  // ASTRA-sim's communicator groups (pg_name -> member ranks), then every file renamed.
  void finish(const std::vector<CommunicatorInfo>& comms, const std::string& prefix) {
    json groups = json::object();
    for (const auto& c : comms) groups[std::to_string(c.id)] = c.ranks;
    add(prefix + ".comm_groups.json", groups.dump(2) + "\n");
    for (auto& f : outs_) f->commit();
  }

 private:
  ChakraExportSummary& sum_;
  std::vector<std::unique_ptr<AtomicFile>> outs_;
};

std::string trace_name(const Trace& t) { return t.path.empty() ? std::string("trace") : t.path; }

[[noreturn]] void negative_rank(const Trace& t, size_t i, int32_t rank) {
  throw InputError(trace_name(t) + ": span " + std::to_string(i) + " has rank " +
                   std::to_string(rank) + "; Chakra files are per rank >= 0");
}

// JSON text must be UTF-8 (and protobuf strings too): bytes that are not become U+FFFD.
std::string meta_text_of(const Trace& header, const std::vector<int32_t>& exported) {
  return meta_json(header, exported).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

ChakraExportSummary export_chakra(const Trace& t, const std::string& prefix) {
  if (t.spans.empty()) throw InputError(trace_name(t) + ": no spans to export");
  if (prefix.empty()) throw InputError("--out: an empty Chakra file prefix");
  // Each rank's spans in trace order.
  std::map<int32_t, std::vector<Span>> by_rank;
  for (size_t i = 0; i < t.spans.size(); ++i) {
    if (t.spans[i].rank < 0) negative_rank(t, i, t.spans[i].rank);
    by_rank[t.spans[i].rank].push_back(t.spans[i]);
  }
  std::vector<int32_t> exported;
  for (const auto& [r, v] : by_rank) exported.push_back(r);
  const std::string meta_text = meta_text_of(t, exported);
  ChakraExportSummary sum;
  sum.ranks = static_cast<int32_t>(exported.size());
  ExportFiles files(sum);
  for (const auto& [rank, v] : by_rank) {
    std::vector<CounterSample> counters;
    for (const auto& c : t.counters)
      if (c.rank == rank) counters.push_back(c);
    const std::string path = rank_file_name(prefix, rank);
    files.add(path, rank_file_bytes(t, rank, v, counters, meta_text, path, sum));
  }
  files.finish(t.comms, prefix);
  return sum;
}

ChakraExportSummary export_chakra_file(const TraceReader& reader, const std::string& prefix) {
  // The header without counters: each rank's are read with its spans.
  Trace header = reader.load_header([](std::string_view) { return false; });
  if (reader.span_count() == 0) throw InputError(trace_name(header) + ": no spans to export");
  if (prefix.empty()) throw InputError("--out: an empty Chakra file prefix");
  const std::vector<int32_t> exported = reader.span_ranks();
  if (!exported.empty() && exported.front() < 0) negative_rank(header, 0, exported.front());
  const std::string meta_text = meta_text_of(header, exported);
  ChakraExportSummary sum;
  sum.ranks = static_cast<int32_t>(exported.size());
  ExportFiles files(sum);
  std::vector<Span> spans;  // the current rank's, in load_all()'s order
  const auto flush = [&]() {
    if (spans.empty()) return;
    const int32_t rank = spans.front().rank;
    const std::vector<CounterSample> counters = reader.counters_of_rank(rank);
    const auto n_strings = static_cast<NameId>(header.strings.size());
    for (const auto& c : counters) {
      if (c.name >= n_strings) {
        throw InputError(reader.path() + ": corrupt trace (counter name id " +
                         std::to_string(c.name) + " outside the string table of " +
                         std::to_string(n_strings) + ")");
      }
    }
    const std::string path = rank_file_name(prefix, rank);
    files.add(path, rank_file_bytes(header, rank, spans, counters, meta_text, path, sum));
    spans.clear();
  };
  reader.for_each_span_run([&](std::span<const Span> run) {
    if (!spans.empty() && spans.front().rank != run.front().rank) flush();
    spans.insert(spans.end(), run.begin(), run.end());
  });
  flush();
  files.finish(header.comms, prefix);
  return sum;
}

namespace {

// Each file's rank (orrery.rank, else the file name's, else the file's position), the files in
// rank order, checked: no rank twice, all written by Orrery or none. Returns whether they are.
bool resolve_ranks(std::vector<RankFile>& files) {
  // Ranks: orrery.rank, else the file name's, else the file's position.
  for (size_t k = 0; k < files.size(); ++k) {
    RankFile& f = files[k];
    const std::string w0 = f.path + ": message 0 (GlobalMetadata)";
    const Attrs a(f.meta.attr(), w0);
    bool any_orrery = false;
    for (const auto& at : f.meta.attr())
      any_orrery = any_orrery || at.name().rfind("orrery.", 0) == 0;
    if (any_orrery) {
      check_seal(f.meta, w0);
      const auto fmt = a.i64("orrery.format");
      if (!fmt) throw InputError(w0 + ": attribute 'orrery.format' is missing");
      if (*fmt > kOrreryChakraFormat || *fmt < 1)
        throw InputError(f.path + ": orrery.format " + std::to_string(*fmt) +
                         ", this Orrery reads 1");
      f.orrery = true;
      const auto r = a.i32("orrery.rank");
      if (!r)
        throw InputError(f.path +
                         ": message 0 (GlobalMetadata): attribute 'orrery.rank' is missing");
      if (f.rank >= 0 && f.rank != *r)
        throw InputError(f.path + ": the file name says rank " + std::to_string(f.rank) +
                         " but its metadata says rank " + std::to_string(*r));
      f.rank = *r;
      for (size_t i = 0; i < f.nodes.size(); ++i) check_seal(f.nodes[i], where(f, i));
    } else if (f.rank < 0) {
      f.rank = static_cast<int32_t>(k);
    }
    check_graph(f);
  }
  std::sort(files.begin(), files.end(),
            [](const RankFile& a, const RankFile& b) { return a.rank < b.rank; });
  for (size_t k = 1; k < files.size(); ++k)
    if (files[k].rank == files[k - 1].rank)
      throw InputError(files[k].path + ": rank " + std::to_string(files[k].rank) + " again (also " +
                       files[k - 1].path + ")");
  const bool orrery = files.front().orrery;
  for (const auto& f : files)
    if (f.orrery != orrery)
      throw InputError(f.path + ": " + (f.orrery ? "written" : "not written") +
                       " by Orrery, unlike " + files.front().path);

  return orrery;
}

// What the producer wrote of the original trace (its source, its extra_json).
struct OrreryMeta {
  std::string source = "chakra";
  json extra = json::object();
};

// Metadata, ranks, streams and communicators of an Orrery export (orrery.meta, the same in every
// file), checked against the files present.
OrreryMeta read_orrery_meta(const std::vector<RankFile>& files, Trace& t) {
  OrreryMeta out;
  // Metadata, ranks, streams and communicators: the same in every file of one export.
  const RankFile& f0 = files.front();
  const auto meta_text =
      Attrs(f0.meta.attr(), f0.path + ": message 0 (GlobalMetadata)").str("orrery.meta");
  if (!meta_text)
    throw InputError(f0.path + ": message 0 (GlobalMetadata): attribute 'orrery.meta' is missing");
  for (const auto& f : files) {
    const auto m = Attrs(f.meta.attr(), f.path + ": message 0 (GlobalMetadata)").str("orrery.meta");
    if (!m || *m != *meta_text)
      throw InputError(f.path + ": its orrery.meta differs from " + f0.path +
                       "'s: the files are not of one export");
  }
  json j;
  try {
    j = json::parse(*meta_text);
    RunMeta& m = t.meta;
    out.source = j.at("source").get<std::string>();
    m.scenario_text = j.at("scenario_text").get<std::string>();
    m.scenario_name = j.at("scenario_name").get<std::string>();
    m.host = j.at("host").get<std::string>();
    m.start_time_unix_ns = j.at("start_time_unix_ns").get<int64_t>();
    m.world_size = j.at("world_size").get<int32_t>();
    m.dp = j.at("dp").get<int32_t>();
    m.tp = j.at("tp").get<int32_t>();
    m.pp = j.at("pp").get<int32_t>();
    m.tokens_per_step = j.at("tokens_per_step").get<int64_t>();
    m.model_flops_per_step = j.at("model_flops_per_step").get<double>();
    m.peak_flops_per_rank = j.at("peak_flops_per_rank").get<double>();
    out.extra = json::parse(j.at("extra_json").get<std::string>());
    // The typed keys (absent from exports written before them: left unknown).
    if (j.contains("layout")) j.at("layout").get_to(m.layout);
    if (j.contains("failure")) j.at("failure").get_to(m.failure);
    for (const auto& r : j.at("ranks")) {
      RankInfo ri;
      ri.rank = r.at("rank").get<int32_t>();
      ri.host = r.at("host").get<std::string>();
      ri.device = r.at("device").get<std::string>();
      ri.dp = r.at("dp").get<int32_t>();
      ri.tp = r.at("tp").get<int32_t>();
      ri.pp = r.at("pp").get<int32_t>();
      t.ranks.push_back(std::move(ri));
    }
    for (const auto& s : j.at("streams"))
      t.streams.push_back({s.at("rank").get<int32_t>(), s.at("stream").get<int32_t>(),
                           s.at("name").get<std::string>()});
    for (const auto& c : j.at("communicators")) {
      CommunicatorInfo ci;
      ci.id = c.at("id").get<int32_t>();
      const auto kind = comm_kind_from_string(c.at("kind").get<std::string>());
      if (!kind)
        throw InputError(f0.path + ": orrery.meta: communicator kind '" +
                         c.at("kind").get<std::string>() + "' unknown");
      ci.kind = *kind;
      ci.name = c.at("name").get<std::string>();
      ci.ranks = c.at("ranks").get<std::vector<int32_t>>();
      t.comms.push_back(std::move(ci));
    }
    // Every exported rank's file must be here, and no other.
    const auto exported = j.at("exported_ranks").get<std::vector<int32_t>>();
    std::set<int32_t> have;
    for (const auto& f : files) have.insert(f.rank);
    for (const int32_t r : exported)
      if (!have.count(r))
        throw InputError(rank_file_name(prefix_of(f0), r) + ": missing: the export has rank " +
                         std::to_string(r) + " (its ranks: " + join(exported) + ")");
    for (const auto& f : files)
      if (std::find(exported.begin(), exported.end(), f.rank) == exported.end())
        throw InputError(f.path + ": rank " + std::to_string(f.rank) +
                         " is not one of this export's ranks (a file left from another export?)");
  } catch (const json::exception& e) {
    throw InputError(
        f0.path +
        ": message 0 (GlobalMetadata): attribute 'orrery.meta' is not the JSON Orrery writes (" +
        e.what() + ")");
  }
  return out;
}

// The counters each file of an Orrery export carries (orrery.counters).
void read_orrery_counters(const std::vector<RankFile>& files, Trace& t) {
  for (const auto& f : files) {
    const auto c =
        Attrs(f.meta.attr(), f.path + ": message 0 (GlobalMetadata)").str("orrery.counters");
    if (!c) continue;
    try {
      for (const auto& s : json::parse(*c)) {
        CounterSample cs;
        cs.rank = f.rank;
        cs.name = t.strings.intern(s.at(0).get<std::string>());
        cs.ts_ns = s.at(1).get<int64_t>();
        cs.value = s.at(2).get<double>();
        t.counters.push_back(cs);
      }
    } catch (const json::exception& e) {
      throw InputError(f.path +
                       ": message 0 (GlobalMetadata): attribute 'orrery.counters' is not the "
                       "JSON Orrery writes (" +
                       e.what() + ")");
    }
  }
}

void read_orrery_spans(const std::vector<RankFile>& files, Trace& t) {
  // Spans: every node, in id order (the trace's own order).
  for (const auto& f : files) {
    std::vector<size_t> order(f.nodes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return f.nodes[a].id() < f.nodes[b].id(); });
    for (const size_t i : order) t.spans.push_back(orrery_span(f, i, t));
  }
}

// A foreign file's nodes as spans (compute stream 0, communication 1), scheduled as soon as
// possible when the file has no start times.
std::vector<ForeignNode> foreign_nodes(const RankFile& f, Trace& t) {
  std::vector<ForeignNode> nodes(f.nodes.size());
  bool any_start = false;
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    const pb::Node& n = f.nodes[i];
    const Attrs a(n.attr(), where(f, i));
    ForeignNode& fn = nodes[i];
    fn.pos = i;
    Span& s = fn.span;
    s.rank = f.rank;
    s.name = t.strings.intern(n.name());
    s.kind = span_kind_of_node(n.type());
    const bool comm = s.kind == SpanKind::Collective || s.kind == SpanKind::P2P;
    s.stream = comm ? 1 : 0;
    if (n.start_time_micros() > uint64_t(INT64_MAX / 2000) ||
        n.duration_micros() > uint64_t(INT64_MAX / 2000))
      throw InputError(where(f, i) + ": start_time_micros or duration_micros beyond 2^62 ns");
    s.start_ns = static_cast<int64_t>(n.start_time_micros()) * 1000;
    s.end_ns = s.start_ns + static_cast<int64_t>(n.duration_micros()) * 1000;
    any_start = any_start || n.start_time_micros() != 0;
    if (comm) {
      s.bytes = a.i64("comm_size").value_or(0);
      if (n.type() == pb::COMM_COLL_NODE) {
        if (auto ct = a.i64("comm_type")) s.op = op_of_comm_type(*ct);
      } else if (n.type() == pb::COMM_SEND_NODE) {
        s.op = CollOp::Send;
        s.peer = a.i32("comm_dst").value_or(-1);
      } else {
        s.op = CollOp::Recv;
        s.peer = a.i32("comm_src").value_or(-1);
      }
      if (auto pg = a.str("pg_name")) {
        fn.pg_name = *pg;
        fn.has_pg = true;
      }
    } else if (auto v = a.i64("num_ops")) {
      s.flops = static_cast<double>(*v);
    }
    if (!comm)
      if (auto v = a.u64("tensor_size"); v && *v <= uint64_t(INT64_MAX))
        s.bytes = static_cast<int64_t>(*v);
  }
  if (!any_start) schedule_as_soon_as_possible(f, nodes);
  return nodes;
}

// Communicators of foreign files by pg_name, over all files.
struct ForeignComms {
  std::map<std::string, int32_t> ids;
  std::vector<std::set<int32_t>> users;
  std::map<std::pair<int32_t, int32_t>, int64_t> next_seq;
};

void number_foreign_comms(const RankFile& f, std::vector<ForeignNode>& nodes, ForeignComms& c) {
  // Communicators by pg_name (ids in order of first use), "world" for nodes without one;
  // sequence numbers per (communicator, rank) in start order.
  std::vector<size_t> by_start(nodes.size());
  for (size_t i = 0; i < by_start.size(); ++i) by_start[i] = i;
  std::stable_sort(by_start.begin(), by_start.end(), [&](size_t a, size_t b) {
    return std::make_tuple(nodes[a].span.start_ns, f.nodes[a].id()) <
           std::make_tuple(nodes[b].span.start_ns, f.nodes[b].id());
  });
  for (const size_t i : by_start) {
    Span& s = nodes[i].span;
    if (s.kind != SpanKind::Collective && s.kind != SpanKind::P2P) continue;
    const std::string key = nodes[i].has_pg ? nodes[i].pg_name : std::string();
    auto [it, inserted] = c.ids.try_emplace(key, static_cast<int32_t>(c.ids.size()));
    if (inserted) c.users.emplace_back();
    s.comm = it->second;
    c.users[static_cast<size_t>(s.comm)].insert(f.rank);
    s.seq = c.next_seq[{s.comm, f.rank}]++;
  }
}

// Another tool's files: what Chakra says, one compute and one communication stream per rank.
void import_foreign(const std::vector<RankFile>& files, Trace& t) {
  const int32_t world = files.back().rank + 1;
  t.meta.world_size = world;
  ForeignComms comms;
  std::vector<Span> spans;
  for (const auto& f : files) {
    t.ranks.push_back({f.rank, "", "", 0, 0, 0});
    t.streams.push_back({f.rank, 0, "compute"});
    t.streams.push_back({f.rank, 1, "comm"});
    std::vector<ForeignNode> nodes = foreign_nodes(f, t);
    number_foreign_comms(f, nodes, comms);
    std::vector<size_t> by_id(nodes.size());
    for (size_t i = 0; i < by_id.size(); ++i) by_id[i] = i;
    std::sort(by_id.begin(), by_id.end(),
              [&](size_t a, size_t b) { return f.nodes[a].id() < f.nodes[b].id(); });
    for (const size_t i : by_id) spans.push_back(nodes[i].span);
  }
  for (const auto& [key, id] : comms.ids) {
    CommunicatorInfo c;
    c.id = id;
    c.name = key.empty() ? "world" : "pg " + key;
    if (key.empty()) {
      for (int32_t r = 0; r < world; ++r) c.ranks.push_back(r);
    } else {
      c.ranks.assign(comms.users[static_cast<size_t>(id)].begin(),
                     comms.users[static_cast<size_t>(id)].end());
    }
    c.kind = static_cast<int32_t>(c.ranks.size()) == world ? CommKind::World : CommKind::Other;
    t.comms.push_back(std::move(c));
  }
  std::sort(t.comms.begin(), t.comms.end(),
            [](const CommunicatorInfo& a, const CommunicatorInfo& b) { return a.id < b.id; });
  t.spans = std::move(spans);
  // Rebased so that the earliest node starts at 0.
  int64_t origin = INT64_MAX;
  for (const auto& s : t.spans) origin = std::min(origin, s.start_ns);
  for (auto& s : t.spans) {
    s.start_ns -= origin;
    s.end_ns -= origin;
  }
}

}  // namespace

Trace import_chakra(const std::vector<std::string>& inputs) {
  const std::vector<std::string> paths = chakra_input_files(inputs);
  if (paths.empty()) throw InputError("import chakra: no input files");
  std::vector<RankFile> files;
  for (const auto& p : paths) files.push_back(read_rank_file(p));
  const bool orrery = resolve_ranks(files);

  Trace t;
  OrreryMeta original;
  if (orrery) {
    original = read_orrery_meta(files, t);
    read_orrery_counters(files, t);
    read_orrery_spans(files, t);
  } else {
    import_foreign(files, t);
  }

  t.sort_spans();
  t.meta.source = TraceSource::Import;
  t.meta.origin = TraceOrigin::Import;
  json extra =
      original.extra.is_object() ? original.extra : json{{"original_extra", original.extra}};
  extra["import"] = {{"format", "chakra"}, {"files", paths}, {"source", original.source}};
  t.meta.extra_json = extra.dump();
  std::sort(t.ranks.begin(), t.ranks.end(),
            [](const RankInfo& a, const RankInfo& b) { return a.rank < b.rank; });
  return t;
}

ChakraFileInfo read_chakra_file(const std::string& path) {
  const RankFile f = read_rank_file(path);
  ChakraFileInfo info;
  info.path = path;
  info.version = f.meta.version();
  info.rank = f.rank;
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    const pb::Node& n = f.nodes[i];
    const Attrs a(n.attr(), where(f, i));
    ChakraNodeInfo ni;
    ni.id = n.id();
    ni.name = n.name();
    ni.exact_name = a.bytes("orrery.name").value_or(n.name());
    ni.type = static_cast<int32_t>(n.type());
    ni.data_deps.assign(n.data_deps().begin(), n.data_deps().end());
    ni.ctrl_deps.assign(n.ctrl_deps().begin(), n.ctrl_deps().end());
    ni.start_time_micros = n.start_time_micros();
    ni.duration_micros = n.duration_micros();
    ni.comm_type = a.i64("comm_type").value_or(-1);
    ni.comm_size = a.i64("comm_size").value_or(-1);
    ni.comm_src = a.i32("comm_src").value_or(-1);
    ni.comm_dst = a.i32("comm_dst").value_or(-1);
    ni.comm_tag = a.i32("comm_tag").value_or(-1);
    ni.pg_name = a.str("pg_name").value_or("");
    ni.num_ops = a.i64("num_ops").value_or(-1);
    ni.is_cpu_op = a.boolean("is_cpu_op").value_or(true);
    ni.duration_ns = a.i64("orrery.duration_ns").value_or(-1);
    info.nodes.push_back(std::move(ni));
  }
  return info;
}

}  // namespace orrery::traces
