// pagellm._core: the Python package's native side, a thin layer over
// EmbeddedEngine (src/embed). Outputs reach Python as plain dicts, lists and
// tuples of what the shared renderer (src/api/output_render.h) says; the
// vLLM-shaped API (LLM, AsyncLLM, SamplingParams, RequestOutput, ...) is
// written in Python on top and only wraps them.
// Every wait releases the GIL, so other Python threads and the asyncio loop
// run while the engine steps.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/error.h"
#include "embed/embedded_engine.h"

namespace nb = nanobind;
namespace api = pagellm::api;
using pagellm::OutputQueue;
using pagellm::embed::EmbeddedEngine;

namespace {

nlohmann::json parse_json(const std::string& text, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw pagellm::InvalidRequest(std::string(what) + " is not valid JSON: " + e.what());
  }
}

// bytes that may end inside a UTF-8 character would fail to decode; the
// engine only emits whole characters, but a stray byte must not raise.
nb::str text_of(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

// Runs pooled requests (embedding or score) to their ends, with the GIL
// released; their finished outputs in order. The first failure aborts the
// rest and is raised.
std::vector<pagellm::RequestOutput> pooled_outputs(EmbeddedEngine& e, const std::vector<std::string>& ids,
                                                   std::vector<std::vector<int32_t>> prompts, bool score) {
  if (ids.size() != prompts.size()) throw pagellm::InvalidRequest("ids and prompts differ in length");
  std::vector<pagellm::EngineRequest> reqs(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    reqs[i].id = ids[i];
    reqs[i].prompt_ids = std::move(prompts[i]);
    (score ? reqs[i].score : reqs[i].embed) = true;
  }
  std::vector<pagellm::RequestOutput> outs(ids.size());
  nb::gil_scoped_release release;  // the engine's steps run meanwhile
  const auto streams = e.submit(std::move(reqs));
  for (size_t i = 0; i < streams.size(); ++i) {
    for (;;) {
      auto out = streams[i]->next(std::chrono::milliseconds(100));
      if (!out) continue;
      if (!out->error.empty() || (out->finished && out->embedding.empty())) {
        for (size_t k = i + 1; k < streams.size(); ++k) e.abort(streams[k]->id());
        if (out->error_kind == pagellm::RequestError::Invalid) throw pagellm::InvalidRequest(out->error);
        throw pagellm::Error(out->error.empty() ? "the request was aborted" : out->error);
      }
      if (out->finished) {
        outs[i] = std::move(*out);
        break;
      }
    }
  }
  return outs;
}

nb::object text_or_none(const char* s) { return s ? nb::object(nb::str(s)) : nb::object(nb::none()); }

nb::object stop_reason(const api::StopReason& r) {
  if (const auto* text = std::get_if<std::string>(&r)) return text_of(*text);
  if (const auto* token = std::get_if<int32_t>(&r)) return nb::int_(*token);
  return nb::none();
}

// (logprob, rank or None, decoded token): vLLM's Logprob fields.
nb::tuple logprob_tuple(const api::RankedToken& t) {
  return nb::make_tuple(t.logprob, t.rank ? nb::object(nb::int_(*t.rank)) : nb::object(nb::none()), text_of(t.piece));
}

// One position as vLLM's dict, token id -> Logprob: the chosen token first,
// then the others of the top.
nb::dict position_dict(const api::PositionLogprobs& p) {
  nb::dict d;
  d[nb::int_(p.chosen.token)] = logprob_tuple(p.chosen);
  for (const api::RankedToken& t : p.top)
    if (t.token != p.chosen.token) d[nb::int_(t.token)] = logprob_tuple(t);
  return d;
}

nb::dict to_python(const api::CompletionData& c) {
  nb::dict d;
  d["index"] = c.index;
  d["text"] = text_of(c.text);
  d["token_ids"] = nb::cast(c.token_ids);
  d["finish_reason"] = text_or_none(c.finish_reason);
  d["stop_reason"] = stop_reason(c.stop_reason);
  d["num_output_tokens"] = c.num_output_tokens;
  if (c.logprobs) {
    nb::list positions;
    for (const api::PositionLogprobs& p : *c.logprobs) positions.append(position_dict(p));
    d["logprobs"] = positions;
  } else {
    d["logprobs"] = nb::none();
  }
  d["logprob_sum"] = c.logprob_sum;
  return d;
}

nb::dict to_python(const api::OutputData& out) {
  nb::list completions;
  for (const api::CompletionData& c : out.completions) completions.append(to_python(c));
  nb::dict o;
  o["request_id"] = out.request_id;
  o["finished"] = out.finished;
  o["error"] = out.error.empty() ? nb::object(nb::none()) : nb::object(nb::str(out.error.c_str()));
  o["num_prompt_tokens"] = out.num_prompt_tokens;
  o["num_cached_tokens"] = out.num_cached_tokens;
  o["queue_s"] = out.queue_seconds;
  o["ttft_s"] = out.ttft_seconds;
  o["e2e_s"] = out.e2e_seconds;
  o["completions"] = completions;
  if (out.prompt_logprobs) {
    nb::list positions;
    for (const api::PositionLogprobs& p : *out.prompt_logprobs) positions.append(position_dict(p));
    o["prompt_logprobs"] = positions;
  } else {
    o["prompt_logprobs"] = nb::none();
  }
  return o;
}

// The outputs of the requests submitted with it, rendered with the engine's
// tokenizer (which the queue keeps alive).
struct RenderingQueue {
  explicit RenderingQueue(const EmbeddedEngine& e) : engine(&e) {}
  std::shared_ptr<OutputQueue> queue = std::make_shared<OutputQueue>();
  const EmbeddedEngine* engine;
};

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "pagellm's native engine (use pagellm.LLM / pagellm.AsyncLLM)";
  m.attr("__version__") = PAGELLM_VERSION;

  // The engine's InvalidRequest is a ValueError; every other engine error a
  // RuntimeError (nanobind's default for std::exception).
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const pagellm::InvalidRequest& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<RenderingQueue>(m, "OutputQueue", "Outputs of many requests, in the order the engine produced them")
      .def(nb::init<const EmbeddedEngine&>(), nb::arg("engine"), nb::keep_alive<1, 2>())
      .def(
          "next",
          [](RenderingQueue& q, double timeout_s) -> nb::object {
            std::optional<api::OutputData> out;
            {
              nb::gil_scoped_release release;
              if (auto raw = q.queue->next(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0))))
                out = q.engine->render(*raw);
            }
            if (!out) return nb::none();
            return to_python(*out);
          },
          nb::arg("timeout_s"), "The next output (a dict), or None when timeout_s passes first")
      .def("__len__", [](const RenderingQueue& q) { return q.queue->size(); });

  nb::class_<EmbeddedEngine>(m, "Engine")
      .def(
          "__init__",
          [](EmbeddedEngine* self, const std::string& args_json) {
            const nlohmann::json args = parse_json(args_json, "engine arguments");
            nb::gil_scoped_release release;  // loading takes a while
            new (self) EmbeddedEngine(args);
          },
          nb::arg("args_json"))
      .def(
          "submit",
          [](EmbeddedEngine& e, const std::vector<std::string>& ids, std::vector<std::vector<int32_t>> prompts,
             const std::vector<std::string>& sampling_json, RenderingQueue& sink) {
            if (sink.engine != &e) throw pagellm::InvalidRequest("submit: the sink belongs to another engine");
            if (ids.size() != prompts.size() || ids.size() != sampling_json.size())
              throw pagellm::InvalidRequest("submit: ids, prompts and sampling parameters differ in length");
            std::vector<pagellm::EngineRequest> reqs;
            reqs.reserve(ids.size());
            for (size_t i = 0; i < ids.size(); ++i)
              reqs.push_back(e.make_request(ids[i], std::move(prompts[i]),
                                            parse_json(sampling_json[i], "sampling parameters")));
            e.submit(std::move(reqs), sink.queue);
          },
          nb::arg("ids"), nb::arg("prompts"), nb::arg("sampling_json"), nb::arg("sink"),
          "Queues requests (all or none); their outputs go to `sink`")
      .def(
          "embed",
          [](EmbeddedEngine& e, const std::vector<std::string>& ids, std::vector<std::vector<int32_t>> prompts) {
            std::vector<std::vector<float>> vectors;
            for (pagellm::RequestOutput& out : pooled_outputs(e, ids, std::move(prompts), false))
              vectors.push_back(std::move(out.embedding));
            return vectors;
          },
          nb::arg("ids"), nb::arg("prompts"), "Pooled vectors of the prompts (embedding requests), in order")
      .def(
          "score",
          [](EmbeddedEngine& e, const std::vector<std::string>& ids, std::vector<std::vector<int32_t>> prompts) {
            std::vector<float> scores;
            for (const pagellm::RequestOutput& out : pooled_outputs(e, ids, std::move(prompts), true))
              scores.push_back(out.score);
            return scores;
          },
          nb::arg("ids"), nb::arg("prompts"), "Scores of the prompts (score requests: a reranker's), in order")
      .def("score_prompt", &EmbeddedEngine::score_prompt, nb::arg("query"), nb::arg("document"))
      .def("abort", &EmbeddedEngine::abort, nb::arg("request_id"))
      .def("load_lora", &EmbeddedEngine::load_lora, nb::arg("name"), nb::arg("path"),
           nb::call_guard<nb::gil_scoped_release>())
      .def("unload_lora", &EmbeddedEngine::unload_lora, nb::arg("name"), nb::call_guard<nb::gil_scoped_release>())
      .def("lora_names", &EmbeddedEngine::lora_names)
      .def(
          "shutdown",
          [](EmbeddedEngine& e, double grace_s) {
            nb::gil_scoped_release release;
            e.shutdown(std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000.0)));
          },
          nb::arg("grace_s") = 0.0)
      .def("encode", &EmbeddedEngine::encode, nb::arg("text"), nb::arg("add_special_tokens") = true)
      .def(
          "decode",
          [](const EmbeddedEngine& e, const std::vector<int32_t>& ids, bool skip_special) {
            return text_of(e.decode(ids, skip_special));
          },
          nb::arg("ids"), nb::arg("skip_special_tokens") = true)
      .def(
          "token_text",
          [](const EmbeddedEngine& e, int32_t id) { return text_of(e.decode({id}, false)); }, nb::arg("id"))
      .def(
          "render_chat",
          [](const EmbeddedEngine& e, const std::string& messages_json, const std::string& options_json) {
            return e.render_chat(parse_json(messages_json, "messages"), parse_json(options_json, "chat options"));
          },
          nb::arg("messages_json"), nb::arg("options_json"))
      .def("stats_json", [](const EmbeddedEngine& e) { return e.stats().dump(); })
      .def_prop_ro("max_model_len", &EmbeddedEngine::max_model_len)
      .def_prop_ro("vocab_size", &EmbeddedEngine::vocab_size)
      .def_prop_ro("num_in_flight", &EmbeddedEngine::num_in_flight)
      .def_prop_ro("bos_token_id", [](const EmbeddedEngine& e) { return e.tokenizer().bos_id(); })
      .def_prop_ro("eos_token_id", [](const EmbeddedEngine& e) { return e.tokenizer().eos_id(); })
      .def("describe", &EmbeddedEngine::describe);
}
