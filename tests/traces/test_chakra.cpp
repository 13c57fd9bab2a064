// Chakra execution traces (traces/chakra.hpp): export -> import keeps every span, attribute,
// stream, communicator, rank, counter and the metadata exactly; the files carry one node per span
// with the dependencies of span_dependencies(), the sizes, tags and groups ASTRA-sim reads; a
// second export of the imported trace is byte for byte the first; damaged or incomplete input is
// an InputError naming the file and the message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "orrery/common/error.hpp"
#include "orrery/traces/chakra.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

using testing::TempDir;

#define SKIP_WITHOUT_PROTOBUF() \
  if (!chakra_available()) GTEST_SKIP() << "built without protobuf: no Chakra support"

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// The message of the InputError `f` throws ("" when it throws none).
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Every span, stream, communicator, rank, counter and metadata field of `b` equals `a`'s (names by
// their strings).
void expect_same_trace(const Trace& a, const Trace& b) {
  ASSERT_EQ(a.spans.size(), b.spans.size());
  for (size_t i = 0; i < a.spans.size(); ++i) {
    Span x = a.spans[i], y = b.spans[i];
    EXPECT_EQ(a.name_of(x), b.name_of(y)) << "span " << i;
    x.name = y.name = 0;
    EXPECT_TRUE(testing::same_span(x, y)) << "span " << i << " (" << a.name_of(a.spans[i]) << ")";
  }
  ASSERT_EQ(a.streams.size(), b.streams.size());
  for (size_t i = 0; i < a.streams.size(); ++i) {
    EXPECT_EQ(a.streams[i].rank, b.streams[i].rank);
    EXPECT_EQ(a.streams[i].stream, b.streams[i].stream);
    EXPECT_EQ(a.streams[i].name, b.streams[i].name);
  }
  ASSERT_EQ(a.comms.size(), b.comms.size());
  for (size_t i = 0; i < a.comms.size(); ++i) {
    EXPECT_EQ(a.comms[i].id, b.comms[i].id);
    EXPECT_EQ(a.comms[i].kind, b.comms[i].kind);
    EXPECT_EQ(a.comms[i].name, b.comms[i].name);
    EXPECT_EQ(a.comms[i].ranks, b.comms[i].ranks);
  }
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t i = 0; i < a.ranks.size(); ++i) {
    EXPECT_EQ(a.ranks[i].rank, b.ranks[i].rank);
    EXPECT_EQ(a.ranks[i].host, b.ranks[i].host);
    EXPECT_EQ(a.ranks[i].device, b.ranks[i].device);
    EXPECT_EQ(std::tie(a.ranks[i].dp, a.ranks[i].tp, a.ranks[i].pp),
              std::tie(b.ranks[i].dp, b.ranks[i].tp, b.ranks[i].pp));
  }
  ASSERT_EQ(a.counters.size(), b.counters.size());
  for (size_t i = 0; i < a.counters.size(); ++i) {
    EXPECT_EQ(a.counters[i].rank, b.counters[i].rank);
    EXPECT_EQ(a.strings.str(a.counters[i].name), b.strings.str(b.counters[i].name));
    EXPECT_EQ(a.counters[i].ts_ns, b.counters[i].ts_ns);
    EXPECT_EQ(a.counters[i].value, b.counters[i].value);
  }
  const RunMeta &m = a.meta, &n = b.meta;
  EXPECT_EQ(n.source, TraceSource::Import);
  EXPECT_EQ(m.scenario_text, n.scenario_text);
  EXPECT_EQ(m.scenario_name, n.scenario_name);
  EXPECT_EQ(m.host, n.host);
  EXPECT_EQ(m.start_time_unix_ns, n.start_time_unix_ns);
  EXPECT_EQ(m.world_size, n.world_size);
  EXPECT_EQ(std::tie(m.dp, m.tp, m.pp), std::tie(n.dp, n.tp, n.pp));
  EXPECT_EQ(m.tokens_per_step, n.tokens_per_step);
  EXPECT_EQ(m.model_flops_per_step, n.model_flops_per_step);
  EXPECT_EQ(m.peak_flops_per_rank, n.peak_flops_per_rank);
  // The original extras are kept, with the import's own record beside them.
  const auto ea = nlohmann::json::parse(m.extra_json), eb = nlohmann::json::parse(n.extra_json);
  for (auto it = ea.begin(); it != ea.end(); ++it)
    EXPECT_EQ(eb.at(it.key()), it.value()) << it.key();
  EXPECT_EQ(eb.at("import").at("format"), "chakra");
  EXPECT_EQ(eb.at("import").at("source"), std::string(to_string(m.source)));
}

// The files of an export hold one node per span, the dependencies of span_dependencies(), and
// the sizes, tags and groups ASTRA-sim reads.
void expect_files_match(const Trace& t, const std::string& prefix) {
  const auto deps = span_dependencies(t);
  std::map<int32_t, std::vector<size_t>> by_rank;
  for (size_t i = 0; i < t.spans.size(); ++i) by_rank[t.spans[i].rank].push_back(i);
  for (const auto& [rank, idx] : by_rank) {
    const ChakraFileInfo f = read_chakra_file(prefix + "." + std::to_string(rank) + ".et");
    EXPECT_EQ(f.version, "0.0.4");
    ASSERT_EQ(f.nodes.size(), idx.size()) << "rank " << rank;
    std::map<uint64_t, const ChakraNodeInfo*> by_id;
    for (const auto& n : f.nodes) by_id[n.id] = &n;
    ASSERT_EQ(by_id.size(), idx.size()) << "node ids are unique";
    std::map<size_t, uint64_t> local;
    for (size_t k = 0; k < idx.size(); ++k) local[idx[k]] = k;
    // File order puts every dependency first.
    std::map<uint64_t, size_t> pos;
    for (size_t k = 0; k < f.nodes.size(); ++k) pos[f.nodes[k].id] = k;
    for (size_t k = 0; k < idx.size(); ++k) {
      const Span& s = t.spans[idx[k]];
      ASSERT_TRUE(by_id.count(k)) << "rank " << rank << " node " << k;
      const ChakraNodeInfo& n = *by_id[k];
      EXPECT_EQ(n.exact_name, t.name_of(s));
      std::vector<uint64_t> want;
      for (const int64_t d : {deps[idx[k]].pred, deps[idx[k]].cross})
        if (d >= 0) want.push_back(local.at(static_cast<size_t>(d)));
      EXPECT_EQ(n.data_deps, want) << "rank " << rank << " node " << k;
      EXPECT_TRUE(n.ctrl_deps.empty());
      for (const uint64_t d : n.data_deps) EXPECT_LT(pos.at(d), pos.at(k));
      EXPECT_EQ(n.duration_ns, s.end_ns - s.start_ns);
      EXPECT_EQ(n.duration_micros, uint64_t((s.end_ns - s.start_ns + 500) / 1000));
      EXPECT_FALSE(n.is_cpu_op);
      switch (s.kind) {
        case SpanKind::Phase:
          EXPECT_EQ(n.type, int32_t(ChakraNodeType::Metadata));
          break;
        case SpanKind::Collective:
          EXPECT_EQ(n.type, int32_t(ChakraNodeType::CommColl));
          EXPECT_EQ(n.comm_size, s.bytes);
          EXPECT_EQ(n.pg_name, std::to_string(s.comm));
          if (s.op == CollOp::AllReduce) {
            EXPECT_EQ(n.comm_type, 0);
          }
          break;
        case SpanKind::P2P:
          EXPECT_EQ(n.type, int32_t(s.op == CollOp::Recv ? ChakraNodeType::CommRecv
                                                         : ChakraNodeType::CommSend));
          EXPECT_EQ(n.comm_size, s.bytes);
          EXPECT_EQ(n.comm_src, s.op == CollOp::Recv ? s.peer : rank);
          EXPECT_EQ(n.comm_dst, s.op == CollOp::Recv ? rank : s.peer);
          EXPECT_GE(n.comm_tag, 0);
          break;
        default:
          EXPECT_EQ(n.type, int32_t(ChakraNodeType::Comp));
          if (s.flops > 0) {
            EXPECT_EQ(n.num_ops, std::llround(s.flops));
          }
      }
    }
  }
}

// Export, check the files, import, compare; export the import again: the same bytes.
void round_trip(const Trace& t, const TempDir& dir) {
  const std::string prefix = dir.path("et/trace");
  std::filesystem::create_directories(dir.path("et"));
  const ChakraExportSummary s = export_chakra(t, prefix);
  EXPECT_EQ(s.nodes, static_cast<int64_t>(t.spans.size()));
  int64_t edges = 0;
  for (const auto& d : span_dependencies(t)) edges += (d.pred >= 0) + (d.cross >= 0);
  EXPECT_EQ(s.data_deps, edges);
  expect_files_match(t, prefix);
  const Trace back = import_chakra({prefix});
  expect_same_trace(t, back);
  EXPECT_EQ(back.meta.layout, t.meta.layout);  // the typed metadata travels
  EXPECT_EQ(back.meta.failure, t.meta.failure);
  EXPECT_EQ(back.meta.origin, TraceOrigin::Import);

  std::filesystem::create_directories(dir.path("et2"));
  const std::string prefix2 = dir.path("et2/trace");
  const ChakraExportSummary s2 = export_chakra(back, prefix2);
  ASSERT_EQ(s2.files.size(), s.files.size());
  for (size_t i = 0; i + 1 < s.files.size(); ++i) {
    // The metadata differs in source and extras (an import of the first export): compare nodes.
    const ChakraFileInfo a = read_chakra_file(s.files[i]), b = read_chakra_file(s2.files[i]);
    ASSERT_EQ(a.nodes.size(), b.nodes.size());
    for (size_t k = 0; k < a.nodes.size(); ++k) {
      EXPECT_EQ(a.nodes[k].id, b.nodes[k].id);
      EXPECT_EQ(a.nodes[k].data_deps, b.nodes[k].data_deps);
      EXPECT_EQ(a.nodes[k].comm_size, b.nodes[k].comm_size);
      EXPECT_EQ(a.nodes[k].duration_ns, b.nodes[k].duration_ns);
    }
  }
  EXPECT_EQ(slurp(s.files.back()), slurp(s2.files.back())) << "comm groups";
}

TEST(Chakra, RoundTripOfARandomTraceKeepsEverything) {
  SKIP_WITHOUT_PROTOBUF();
  TempDir dir;
  Trace t = testing::make_trace(3, 200, 11);
  // A name that is not UTF-8 (proto3 strings must be): kept exactly through orrery.name.
  t.spans[7].name = t.strings.intern(std::string("bad \xff\xfe name \xc3", 13));
  round_trip(t, dir);
  const ChakraFileInfo f = read_chakra_file(dir.path("et/trace.0.et"));
  bool replaced = false;
  for (const auto& n : f.nodes)
    replaced = replaced || n.name == "bad \xEF\xBF\xBD\xEF\xBF\xBD name \xEF\xBF\xBD";
  EXPECT_TRUE(replaced) << "Chakra's name field holds the UTF-8 form";
}

TEST(Chakra, RoundTripOfAPipelineTraceKeepsSendsAndReceives) {
  SKIP_WITHOUT_PROTOBUF();
  TempDir dir;
  SynthOptions o;
  o.ranks = 4;
  o.pp = 2;
  o.layers = 4;
  o.steps = 2;
  o.micro_batches = 3;
  const Trace t = synthesize(o);
  int64_t p2p = 0;
  for (const auto& s : t.spans) p2p += s.kind == SpanKind::P2P;
  ASSERT_GT(p2p, 0) << "a pipeline trace has sends and receives";
  round_trip(t, dir);
  // Each send's tag equals its receive's: the k-th of a flow on both sides.
  std::map<std::tuple<int32_t, int32_t, int32_t>, int64_t> sends, recvs;  // (src, dst, tag)
  for (int32_t r = 0; r < o.ranks; ++r)
    for (const auto& n :
         read_chakra_file(dir.path("et/trace") + "." + std::to_string(r) + ".et").nodes) {
      if (n.type == int32_t(ChakraNodeType::CommSend))
        sends[{n.comm_src, n.comm_dst, n.comm_tag}] = n.comm_size;
      if (n.type == int32_t(ChakraNodeType::CommRecv))
        recvs[{n.comm_src, n.comm_dst, n.comm_tag}] = n.comm_size;
    }
  EXPECT_EQ(static_cast<int64_t>(sends.size() + recvs.size()), p2p);
  EXPECT_EQ(sends, recvs);
}

// `orrery export --format chakra` reads a rank at a time (export_chakra_file): the same files, byte
// for byte, and the same summary as the export of the whole loaded trace.
void expect_streamed_export_same(const Trace& t, const TempDir& dir, const std::string& name) {
  SCOPED_TRACE(name);
  const std::string db = dir.path(name + ".db");
  write_trace(t, db, false, 61);  // many blocks per stream
  TraceReader reader(db);
  Trace whole = reader.load_all();
  const ChakraExportSummary a = export_chakra(whole, dir.path(name + "_whole"));
  const ChakraExportSummary b = export_chakra_file(reader, dir.path(name + "_streamed"));
  EXPECT_EQ(a.ranks, b.ranks);
  EXPECT_EQ(a.nodes_by_rank, b.nodes_by_rank);
  EXPECT_EQ(a.nodes, b.nodes);
  EXPECT_EQ(a.data_deps, b.data_deps);
  EXPECT_EQ(a.comm_nodes, b.comm_nodes);
  EXPECT_EQ(a.phase_nodes, b.phase_nodes);
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    const std::string x = slurp(a.files[i]), y = slurp(b.files[i]);
    EXPECT_FALSE(x.empty());
    EXPECT_TRUE(x == y) << a.files[i] << " and " << b.files[i] << " differ";
  }
}

TEST(Chakra, StreamedExportIsTheWholeTracesExportByteForByte) {
  SKIP_WITHOUT_PROTOBUF();
  TempDir dir;
  Trace random = testing::make_trace(3, 200, 11);
  random.spans[7].name = random.strings.intern(std::string("bad \xff name"));
  expect_streamed_export_same(random, dir, "random");
  SynthOptions o;
  o.ranks = 4;
  o.pp = 2;
  o.layers = 4;
  o.steps = 3;
  expect_streamed_export_same(synthesize(o), dir, "pipeline");
  o.pp = 1;
  o.jitter_ns = 30'000;
  expect_streamed_export_same(synthesize(o), dir, "ddp");
  // A span of rank -1: the same refusal, naming the first such span.
  Trace bad = testing::make_trace(2, 20, 3);
  for (auto& s : bad.spans)
    if (s.rank == 1) s.rank = -1;
  write_trace(bad, dir.path("bad.db"), false, 61);
  TraceReader reader(dir.path("bad.db"));
  const std::string want =
      input_error([&] { export_chakra(reader.load_all(), dir.path("bad_whole")); });
  EXPECT_NE(want.find("has rank -1"), std::string::npos) << want;
  EXPECT_EQ(input_error([&] { export_chakra_file(reader, dir.path("bad_streamed")); }), want);
}

TEST(Chakra, CommGroupsFileNamesEveryCommunicator) {
  SKIP_WITHOUT_PROTOBUF();
  TempDir dir;
  const Trace t = testing::make_trace(2, 20, 3);
  const auto s = export_chakra(t, dir.path("t"));
  ASSERT_EQ(s.files.size(), 3u);
  EXPECT_EQ(s.files[0], dir.path("t.0.et"));
  EXPECT_EQ(s.files[1], dir.path("t.1.et"));
  const auto j = nlohmann::json::parse(slurp(dir.path("t.comm_groups.json")));
  EXPECT_EQ(j.at("0"), nlohmann::json({0, 1}));
  EXPECT_EQ(j.at("1"), nlohmann::json({0, 1}));
}

TEST(Chakra, DamagedFilesAreInputErrorsNamingFileAndMessage) {
  SKIP_WITHOUT_PROTOBUF();
  TempDir dir;
  const Trace t = testing::make_trace(2, 30, 5);
  export_chakra(t, dir.path("t"));
  const std::string f0 = dir.path("t.0.et"), f1 = dir.path("t.1.et");
  const std::string good = slurp(f1);

  // Truncated in the middle of a node.
  spit(f1, good.substr(0, good.size() - 7));
  std::string e = input_error([&] { import_chakra({dir.path("t")}); });
  EXPECT_NE(e.find(f1 + ": message "), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  // A length prefix that never ends (every byte has its continuation bit).
  spit(f1, good + std::string(12, '\xff'));
  e = input_error([&] { import_chakra({dir.path("t")}); });
  EXPECT_NE(e.find(f1 + ": message "), std::string::npos) << e;
  EXPECT_NE(e.find("not a valid varint"), std::string::npos) << e;

  // A first message that protobuf cannot parse (a field with wire type 7).
  std::string bad = good;
  bad[1] = '\x0f';
  spit(f1, bad);
  e = input_error([&] { import_chakra({dir.path("t")}); });
  EXPECT_NE(e.find(f1 + ": message 0 at byte 0"), std::string::npos) << e;

  // Any one flipped bit, anywhere in the file: a framing or parse error, or a checksum mismatch.
  {
    const Trace small = testing::make_trace(2, 4, 9);
    export_chakra(small, dir.path("s"));
    const std::string s0 = dir.path("s.0.et"), s1 = dir.path("s.1.et");
    const std::string whole = slurp(s1);
    ASSERT_GT(whole.size(), 200u);
    size_t refused = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      for (const int bit : {0, 7}) {
        std::string b = whole;
        b[i] = static_cast<char>(b[i] ^ (1 << bit));
        spit(s1, b);
        const std::string msg = input_error([&] { import_chakra({dir.path("s")}); });
        if (msg.find(s1 + ": ") == 0) {
          ++refused;
        } else {
          ADD_FAILURE() << "byte " << i << " bit " << bit << ": "
                        << (msg.empty() ? "imported" : msg);
        }
      }
    }
    EXPECT_EQ(refused, 2 * whole.size());
    spit(s1, whole);
    EXPECT_EQ(import_chakra({dir.path("s")}).spans.size(), small.spans.size());
  }

  // A rank file missing.
  std::filesystem::remove(f1);
  e = input_error([&] { import_chakra({dir.path("t")}); });
  EXPECT_NE(e.find(f1 + ": missing"), std::string::npos) << e;
  // Nothing matches a prefix.
  e = input_error([&] { import_chakra({dir.path("nothing")}); });
  EXPECT_NE(e.find(dir.path("nothing") + ": no such file"), std::string::npos) << e;
  // An empty file.
  spit(f1, "");
  e = input_error([&] { import_chakra({f0, f1}); });
  EXPECT_NE(e.find(f1 + ": empty file"), std::string::npos) << e;
}

// Hand-encoded protobuf of another tool's file: GlobalMetadata{version "0.0.4"}, then nodes.
std::string framed(const std::string& body) { return std::string(1, char(body.size())) + body; }
const std::string kMeta =
    framed(std::string("\x0a\x05"
                       "0.0.4",
                       7));

TEST(Chakra, ADependencyOnANodeTheFileLacksIsRefused) {
  SKIP_WITHOUT_PROTOBUF();
  TempDir dir;
  // Node{id 0, type COMP, data_deps [7]}
  spit(dir.path("x.0.et"), kMeta + framed(std::string("\x08\x00\x18\x04\x2a\x01\x07", 7)));
  const std::string e = input_error([&] { import_chakra({dir.path("x")}); });
  EXPECT_NE(e.find(dir.path("x.0.et") + ": message 1 (node id 0): data dependency on node id 7, "
                                        "which the file does not have"),
            std::string::npos)
      << e;
}

TEST(Chakra, AnotherToolsFileImportsWithItsDependenciesScheduled) {
  SKIP_WITHOUT_PROTOBUF();
  TempDir dir;
  // Rank 0: A (id 1, COMP, 10 us), B (id 2, COMP, 5 us, after A), C (id 3, all-reduce of 4096 bytes
  // on pg "7", 3 us, after B). No start times: the import schedules them after their dependencies.
  const std::string a =
      framed(std::string("\x08\x01\x12\x01"
                         "A\x18\x04\x38\x0a",
                         9));
  const std::string b =
      framed(std::string("\x08\x02\x12\x01"
                         "B\x18\x04\x2a\x01\x01\x38\x05",
                         12));
  // attr {name "comm_size", int64_val 4096}, attr {name "pg_name", string_val "7"}
  const std::string size_attr = std::string(
      "\x0a\x09"
      "comm_size\x48\x80\x20",
      14);
  const std::string pg_attr = std::string(
      "\x0a\x07"
      "pg_name\xea\x01\x01"
      "7",
      13);
  const std::string c =
      framed(std::string("\x08\x03\x12\x01"
                         "C\x18\x07\x2a\x01\x02\x38\x03",
                         12) +
             "\x52" + char(size_attr.size()) + size_attr + "\x52" + char(pg_attr.size()) + pg_attr);
  spit(dir.path("y.0.et"), kMeta + a + b + c);
  const Trace t = import_chakra({dir.path("y")});
  ASSERT_EQ(t.spans.size(), 3u);
  std::map<std::string, Span> by_name;
  for (const auto& s : t.spans) by_name[t.name_of(s)] = s;
  EXPECT_EQ(by_name["A"].start_ns, 0);
  EXPECT_EQ(by_name["A"].end_ns, 10000);
  EXPECT_EQ(by_name["B"].start_ns, 10000);
  EXPECT_EQ(by_name["B"].end_ns, 15000);
  EXPECT_EQ(by_name["C"].kind, SpanKind::Collective);
  EXPECT_EQ(by_name["C"].start_ns, 15000);
  EXPECT_EQ(by_name["C"].bytes, 4096);
  EXPECT_EQ(by_name["C"].op, CollOp::None);  // no comm_type attribute
  ASSERT_EQ(t.comms.size(), 1u);
  EXPECT_EQ(t.comms[0].name, "pg 7");
  EXPECT_EQ(by_name["C"].comm, 0);
  EXPECT_EQ(by_name["C"].seq, 0);
}

TEST(Chakra, WithoutProtobufEveryEntryPointSaysSo) {
  if (chakra_available()) GTEST_SKIP() << "built with protobuf";
  const std::string e = input_error([] { import_chakra({"x"}); });
  EXPECT_NE(e.find("built without protobuf"), std::string::npos) << e;
}

}  // namespace
}  // namespace orrery::traces
