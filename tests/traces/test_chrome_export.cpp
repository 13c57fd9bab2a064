// Chrome trace JSON: parse the output back with nlohmann_json and check every event exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "orrery/common/error.hpp"
#include "orrery/traces/chrome_export.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

using nlohmann::json;

TEST(ChromeExport, EventsAndValuesAreExact) {
  Trace t = testing::make_trace(2, 100);
  // A name that needs escaping, an unnamed stream, negative and sub-microsecond times.
  const NameId odd = t.strings.intern("tab\there \"q\" \x01 end");
  Span s;
  s.rank = 1;
  s.stream = 5;
  s.kind = SpanKind::P2P;
  s.name = odd;
  s.start_ns = -1500;
  s.end_ns = 7;
  s.peer = 0;
  s.bytes = 123456789012;
  s.op = CollOp::Send;
  t.spans.push_back(s);
  t.sort_spans();

  std::ostringstream out;
  export_chrome_json(t, out);
  const json doc = json::parse(out.str());
  ASSERT_TRUE(doc.contains("traceEvents"));
  const auto& ev = doc["traceEvents"];
  std::map<std::string, size_t> by_ph;
  for (const auto& e : ev) by_ph[e["ph"].get<std::string>()] += 1;
  EXPECT_EQ(by_ph["X"], t.spans.size());
  EXPECT_EQ(by_ph["C"], t.counters.size());
  // 2 process names; 4 named streams + the unnamed stream 5 of rank 1.
  EXPECT_EQ(by_ph["M"], 2u + 5u);
  EXPECT_EQ(ev.size(), t.spans.size() + t.counters.size() + 7);

  std::map<int, std::string> process;
  std::map<std::pair<int, int>, std::string> thread;
  for (const auto& e : ev) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") process[e["pid"]] = e["args"]["name"];
    if (e["name"] == "thread_name") thread[{e["pid"], e["tid"]}] = e["args"]["name"];
  }
  EXPECT_EQ(process[0], "rank 0 (dp=0,tp=0,pp=0)");
  EXPECT_EQ(process[1], "rank 1 (dp=1,tp=0,pp=0)");
  EXPECT_EQ((thread[{0, 0}]), "compute");
  EXPECT_EQ((thread[{1, 1}]), "comm");
  EXPECT_EQ((thread[{1, 5}]), "stream 5");

  // X events come out in the trace's span order: compare each with its span.
  size_t i = 0;
  for (const auto& e : ev) {
    if (e["ph"] != "X") continue;
    const Span& sp = t.spans[i++];
    EXPECT_EQ(e["name"].get<std::string>(), t.strings.str(sp.name));
    EXPECT_EQ(e["cat"].get<std::string>(), to_string(sp.kind));
    EXPECT_EQ(e["pid"].get<int>(), sp.rank);
    EXPECT_EQ(e["tid"].get<int>(), sp.stream);
    // ts/dur are microseconds with three decimals: exact nanoseconds after rounding.
    EXPECT_EQ(std::llround(e["ts"].get<double>() * 1000.0), sp.start_ns);
    EXPECT_EQ(std::llround(e["dur"].get<double>() * 1000.0), sp.duration_ns());
    const auto& a = e["args"];
    EXPECT_EQ(a.value("step", -1), sp.step);
    EXPECT_EQ(a.value("micro_batch", -1), sp.micro_batch);
    EXPECT_EQ(a.value("layer", -1), sp.layer);
    EXPECT_EQ(a.value("bytes", int64_t{0}), sp.bytes);
    EXPECT_EQ(a.value("flops", 0.0), sp.flops);
    EXPECT_EQ(a.value("comm", -1), sp.comm);
    EXPECT_EQ(a.value("peer", -1), sp.peer);
    EXPECT_EQ(a.value("seq", int64_t{-1}), sp.seq);
    EXPECT_EQ(a.value("op", std::string("none")), to_string(sp.op));
    if (sp.comm >= 0) {
      EXPECT_EQ(a["comm_name"], t.comm(sp.comm)->name);
    }
  }
  EXPECT_EQ(i, t.spans.size());

  size_t k = 0;
  for (const auto& e : ev) {
    if (e["ph"] != "C") continue;
    const auto& c = t.counters[k++];
    EXPECT_EQ(e["name"].get<std::string>(), t.strings.str(c.name));
    EXPECT_EQ(e["pid"].get<int>(), c.rank);
    EXPECT_EQ(std::llround(e["ts"].get<double>() * 1000.0), c.ts_ns);
    EXPECT_EQ(e["args"]["value"].get<double>(), c.value);
  }
}

TEST(ChromeExport, MicrosecondFormatting) {
  Trace t;
  const NameId n = t.strings.intern("k");
  t.spans.push_back({0, 0, SpanKind::Compute, n, 1234567, 1235567});
  t.spans.push_back({0, 0, SpanKind::Compute, n, 2000000, 2000001});
  std::ostringstream out;
  export_chrome_json(t, out);
  const std::string s = out.str();
  EXPECT_NE(s.find("\"ts\":1234.567,\"dur\":1,"), std::string::npos) << s;
  EXPECT_NE(s.find("\"ts\":2000,\"dur\":0.001,"), std::string::npos) << s;
}

TEST(ChromeExport, FileExportIsAtomic) {
  testing::TempDir dir;
  const Trace t = testing::make_trace(1, 10);
  const auto path = dir.path("out.json");
  export_chrome_json_file(t, path);
  std::ifstream f(path);
  const json doc = json::parse(f);
  EXPECT_EQ(doc["traceEvents"].size(), 10u * 2 + 20 + 1 + 2);
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  EXPECT_THROW(export_chrome_json_file(t, dir.path("no/such/dir/out.json")), InputError);
}

// The streamed export from a file writes the bytes the in-memory export of its load_all() does,
// on a trace whose streams span several windows, with counters and communicators.
TEST(ChromeExport, StreamedFromTheFileIsByteIdentical) {
  testing::TempDir dir;
  SynthOptions o;
  o.ranks = 2;
  o.steps = synth_steps_for_spans(o, 300'000);
  const auto path = dir.path("s.db");
  write_trace(synthesize(o), path);
  const Trace t = load_trace(path);
  ASSERT_GT(t.counters.size(), 0u);
  ASSERT_GT(t.comms.size(), 0u);
  std::ostringstream a, b;
  export_chrome_json(t, a);
  export_chrome_json(TraceReader(path), b);
  ASSERT_GT(a.str().size(), 1000u);
  EXPECT_TRUE(a.str() == b.str()) << "sizes " << a.str().size() << " and " << b.str().size();
}

}  // namespace
}  // namespace orrery::traces
