// Byte-for-byte agreement with Python's jinja2 as transformers configures it:
// every case in tests/fixtures/chat_templates/{language,models}.json (made by
// tools/gen_chat_template_fixtures.py) renders to the recorded output, or
// fails the way Python failed (same exception class; same message for the
// template's own raise_exception()).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/value.h"
#include "test_paths.h"

namespace pagellm {
namespace {

using nlohmann::ordered_json;

ordered_json load_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return ordered_json();
  std::stringstream ss;
  ss << f.rdbuf();
  return ordered_json::parse(ss.str());
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The generator's FIXED_NOW: 2024-07-26 13:05:09, a Friday, day 208.
ChatRenderOptions fixed_clock() {
  ChatRenderOptions o;
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 13;
  tm.tm_min = 5;
  tm.tm_sec = 9;
  tm.tm_wday = 5;
  tm.tm_yday = 207;
  o.now = tm;
  return o;
}

std::string test_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// Renders with `render` and compares with the case's "expected" / "error".
template <class Render>
void check_case(const ordered_json& c, Render&& render) {
  if (c.contains("expected")) {
    std::string out;
    try {
      out = render();
    } catch (const std::exception& e) {
      FAIL() << "threw instead of rendering: " << e.what();
    }
    EXPECT_EQ(out, c["expected"].get<std::string>());
    return;
  }
  const std::string type = c["error"]["type"];
  const std::string message = c["error"]["message"];
  try {
    const std::string out = render();
    FAIL() << "rendered instead of raising " << type << ": " << message << "\noutput: " << out;
  } catch (const TemplateError& e) {
    EXPECT_EQ(type, "TemplateError") << e.what();
    EXPECT_EQ(std::string(e.what()), message);
  } catch (const jinja::RenderError& e) {
    EXPECT_EQ(e.py_type(), type) << "python: " << message << "\nours: " << e.what();
    // Python's RecursionError text depends on the interpreter's stack; ours names the macro.
    if (type != "RecursionError") {
      EXPECT_EQ(e.detail(), message);
    }
  }
}

// ---- language.json ---------------------------------------------------------------

}  // namespace
}  // namespace pagellm

// Short names in gtest output instead of whole fixture dumps.
namespace nlohmann {
inline void PrintTo(const ordered_json& j, std::ostream* os) {
  *os << (j.contains("name") ? j["name"].get<std::string>() : std::string("case"));
}
}  // namespace nlohmann

namespace pagellm {
namespace {

class LanguageFixture : public ::testing::TestWithParam<ordered_json> {};

TEST_P(LanguageFixture, MatchesJinja2) {
  const ordered_json& c = GetParam();
  const std::string source = c["template"];
  SCOPED_TRACE("template: " + source);
  if (c.contains("error") && c["error"]["type"] == "TemplateSyntaxError") {
    EXPECT_THROW(ChatTemplate{source}, jinja::SyntaxError) << "python: " << c["error"]["message"];
    return;
  }
  std::unique_ptr<ChatTemplate> t;
  try {
    t = std::make_unique<ChatTemplate>(source);
  } catch (const std::exception& e) {
    FAIL() << "failed to parse: " << e.what();
  }
  check_case(c, [&] { return t->render(c["context"], fixed_clock()); });
}

std::vector<ordered_json> language_cases() {
  const ordered_json doc = load_json(test::fixture("chat_templates/language.json"));
  std::vector<ordered_json> out;
  if (doc.is_object())
    for (const auto& c : doc["cases"]) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(ChatTemplateLanguage, LanguageFixture, ::testing::ValuesIn(language_cases()),
                         [](const auto& info) { return test_name(info.param["name"].template get<std::string>()); });

// ---- models.json -----------------------------------------------------------------

struct ModelCase {
  ordered_json c;
  ordered_json tmpl;  // the "templates" entry it uses
};

void PrintTo(const ModelCase& m, std::ostream* os) {
  *os << m.c["template"].get<std::string>() << " / " << m.c["conversation"].get<std::string>();
}

class ModelFixture : public ::testing::TestWithParam<ModelCase> {};

std::string template_source(const ordered_json& tmpl) {
  const std::string source = tmpl["source"];
  if (source == "builtin:gemma3") return builtin_chat_template("gemma3");
  if (source.starts_with("fixtures:")) return read_file(test::fixture("chat_templates/" + source.substr(9)));
  const std::string path = test::shared_data(source);
  if (!std::filesystem::exists(path)) return {};
  if (source.ends_with(".jinja")) return read_file(path);
  return load_json(path)["chat_template"].get<std::string>();
}

TEST_P(ModelFixture, MatchesTransformers) {
  const ModelCase& mc = GetParam();
  const std::string source = mc.tmpl["source"];
  if (source != "builtin:gemma3" && !source.starts_with("fixtures:")) REQUIRE_FILE(test::shared_data(source));
  static std::map<std::string, std::shared_ptr<ChatTemplate>> cache;
  auto& t = cache[mc.tmpl["name"]];
  if (!t) t = std::make_shared<ChatTemplate>(template_source(mc.tmpl));
  check_case(mc.c, [&] {
    return apply_chat_template(*t, mc.c["messages"], mc.c["add_generation_prompt"].get<bool>(), mc.tmpl["bos_token"],
                               mc.tmpl["eos_token"], mc.c["extra"], fixed_clock());
  });
}

std::vector<ModelCase> model_cases() {
  const ordered_json doc = load_json(test::fixture("chat_templates/models.json"));
  std::vector<ModelCase> out;
  if (!doc.is_object()) return out;
  std::map<std::string, ordered_json> templates;
  for (const auto& t : doc["templates"]) templates[t["name"]] = t;
  for (const auto& c : doc["cases"]) out.push_back({c, templates[c["template"]]});
  return out;
}

INSTANTIATE_TEST_SUITE_P(ChatTemplateModels, ModelFixture, ::testing::ValuesIn(model_cases()), [](const auto& info) {
  const auto& c = info.param.c;
  return test_name(c["template"].template get<std::string>() + "_" + c["conversation"].template get<std::string>() +
                   (c["add_generation_prompt"].template get<bool>() ? "" : "_nogen"));
});

TEST(ChatTemplateModels, EveryTemplateParses) {
  const ordered_json doc = load_json(test::fixture("chat_templates/models.json"));
  ASSERT_TRUE(doc.is_object());
  for (const auto& t : doc["templates"]) {
    const std::string source = template_source(t);
    if (source.empty()) continue;
    EXPECT_NO_THROW(ChatTemplate{source}) << t["name"];
  }
}

}  // namespace
}  // namespace pagellm
