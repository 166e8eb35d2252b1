#include "core/trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "test_paths.h"

namespace pagellm {

TEST(Trace, WritesChromeTraceEventsFromEveryThread) {
  trace::enable(true);
  {
    trace::Scope a("outer", "test");
    std::string temp_name = "a weight name that goes away";
    { trace::Scope b(temp_name.c_str(), "op"); }
    temp_name.assign(temp_name.size(), 'x');  // the event kept its own copy
    std::thread([] { trace::Scope c("worker", "test"); }).join();
  }
  trace::enable(false);
  { trace::Scope ignored("not recorded", "test"); }
  const std::string path = test::temp_dir() + "/trace.json";
  trace::write(path);
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<int64_t>(), 0);
    names.insert(e["name"].get<std::string>());
  }
  EXPECT_TRUE(names.count("outer"));
  EXPECT_TRUE(names.count("worker"));
  EXPECT_TRUE(names.count("a weight name that goes away"));
  EXPECT_FALSE(names.count("not recorded"));
}

}  // namespace pagellm
