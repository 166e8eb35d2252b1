// /v1/embeddings request parsing (every input shape, encoding_format,
// dimensions, the 400s naming their field) and the response's shape,
// base64 against a reference decoding.
#include "api/embedding_request.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::api {
namespace {

using nlohmann::json;

class EmbeddingRequestTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::shared_data("models/stories260K.gguf");
    REQUIRE_FILE(path);
    tok_ = Tokenizer::load(path);
    m_.name = "stories";
    m_.tokenizer = tok_.get();
    m_.vocab_size = tok_->vocab_size();
    m_.max_model_len = 16;
  }

  std::string error_param(const json& body) {
    try {
      parse_embedding_request(body, m_, 64);
    } catch (const InvalidRequest& e) {
      return e.param().empty() ? "<none>" : e.param();
    }
    ADD_FAILURE() << "parsed: " << body;
    return "";
  }

  std::unique_ptr<Tokenizer> tok_;
  ServedModel m_;
};

TEST_F(EmbeddingRequestTest, InputShapes) {
  const auto once = tok_->encode("Once upon", true, true);
  auto r = parse_embedding_request({{"input", "Once upon"}}, m_, 64);
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0], once);
  EXPECT_FALSE(r.base64);
  EXPECT_FALSE(r.dimensions);
  r = parse_embedding_request({{"input", {"Once upon", "a time"}}, {"model", "stories"}}, m_, 64);
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs[0], once);
  EXPECT_EQ(r.inputs[1], tok_->encode("a time", true, true));
  r = parse_embedding_request({{"input", {5, 6, 7}}}, m_, 64);
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0], (std::vector<int32_t>{5, 6, 7}));
  r = parse_embedding_request({{"input", {{5, 6}, {7}}}, {"encoding_format", "base64"}, {"dimensions", 8}}, m_, 64);
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs[1], std::vector<int32_t>{7});
  EXPECT_TRUE(r.base64);
  EXPECT_EQ(r.dimensions, 8);
}

TEST_F(EmbeddingRequestTest, BadInputNamesTheField) {
  EXPECT_EQ(error_param(json::object()), "input");
  EXPECT_EQ(error_param({{"input", json::array()}}), "input");
  EXPECT_EQ(error_param({{"input", 5}}), "input");
  EXPECT_EQ(error_param({{"input", {"ok", 5}}}), "input");
  EXPECT_EQ(error_param({{"input", {{1, 2}, json::array()}}}), "input");
  EXPECT_EQ(error_param({{"input", {1, -3}}}), "input");
  EXPECT_EQ(error_param({{"input", {1, 100000}}}), "input");
  EXPECT_EQ(error_param({{"input", std::vector<int>(16, 5)}}), "input");  // the context is 16
  EXPECT_EQ(error_param({{"input", "x"}, {"encoding_format", "int8"}}), "encoding_format");
  EXPECT_EQ(error_param({{"input", "x"}, {"encoding_format", 1}}), "encoding_format");
  EXPECT_EQ(error_param({{"input", "x"}, {"dimensions", 0}}), "dimensions");
  EXPECT_EQ(error_param({{"input", "x"}, {"dimensions", 65}}), "dimensions");
  EXPECT_EQ(error_param({{"input", "x"}, {"dimensions", "8"}}), "dimensions");
  EXPECT_THROW(parse_embedding_request({{"input", "x"}, {"model", "other"}}, m_, 64), ModelNotFound);
}

// Reference base64 decoding, then the bytes as little-endian float32.
std::vector<float> decode_base64_floats(const std::string& s) {
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    acc = (acc << 6) | static_cast<uint32_t>(alphabet.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  std::vector<float> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint32_t u = bytes[4 * i] | (bytes[4 * i + 1] << 8) | (bytes[4 * i + 2] << 16) |
                       (static_cast<uint32_t>(bytes[4 * i + 3]) << 24);
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

TEST(EmbeddingResponse, ShapeAndBase64) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (size_t n : {1u, 2u, 3u, 7u}) {
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    EXPECT_EQ(decode_base64_floats(floats_to_base64(v)), v);
  }
  const std::vector<std::vector<float>> vectors = {{0.5f, -1.0f}, {0.25f, 2.0f}};
  const json r = embedding_response(vectors, false, "m", 7);
  EXPECT_EQ(r["object"], "list");
  EXPECT_EQ(r["model"], "m");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(r["usage"]["total_tokens"], 7);
  ASSERT_EQ(r["data"].size(), 2u);
  EXPECT_EQ(r["data"][1]["object"], "embedding");
  EXPECT_EQ(r["data"][1]["index"], 1);
  EXPECT_EQ(r["data"][1]["embedding"].get<std::vector<float>>(), vectors[1]);
  const json b = embedding_response(vectors, true, "m", 7);
  EXPECT_EQ(decode_base64_floats(b["data"][0]["embedding"].get<std::string>()), vectors[0]);
}

}  // namespace
}  // namespace pagellm::api
