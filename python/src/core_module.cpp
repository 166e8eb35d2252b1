// pagellm._core: the Python package's native side, a thin layer over
// EmbeddedEngine (src/embed). Python objects are built here; the vLLM-shaped
// API (LLM, AsyncLLM, SamplingParams, ...) is written in Python on top.
// Every wait releases the GIL, so other Python threads and the asyncio loop
// run while the engine steps.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "embed/embedded_engine.h"

namespace nb = nanobind;
using pagellm::OutputQueue;
using pagellm::RequestOutput;
using pagellm::embed::EmbeddedEngine;

namespace {

nlohmann::json parse_json(const std::string& text, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw pagellm::InvalidRequest(std::string(what) + " is not valid JSON: " + e.what());
  }
}

nb::object finish_reason(pagellm::FinishReason r) {
  if (r == pagellm::FinishReason::None) return nb::none();
  return nb::str(pagellm::to_string(r));
}

// bytes that may end inside a UTF-8 character would fail to decode; the
// engine only emits whole characters, but a stray byte must not raise.
nb::str text_of(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

nb::dict to_python(const RequestOutput& out) {
  nb::list completions;
  for (const pagellm::CompletionDelta& d : out.completions) {
    nb::dict c;
    c["index"] = d.index;
    c["text"] = text_of(d.text);
    c["token_ids"] = nb::cast(d.token_ids);
    c["finish_reason"] = finish_reason(d.finish_reason);
    if (!d.stop_string.empty()) c["stop_reason"] = text_of(d.stop_string);
    else if (d.stop_token >= 0) c["stop_reason"] = d.stop_token;
    else c["stop_reason"] = nb::none();
    c["num_output_tokens"] = d.num_output_tokens;
    if (!d.logprobs.empty()) {
      nb::list lps;
      for (const pagellm::TokenLogprob& lp : d.logprobs) {
        nb::list top;
        for (const auto& [tok, v] : lp.top) top.append(nb::make_tuple(tok, v));
        lps.append(nb::make_tuple(lp.token, lp.logprob, top));
      }
      c["logprobs"] = lps;
    } else {
      c["logprobs"] = nb::none();
    }
    completions.append(c);
  }
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
  return o;
}

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

  nb::class_<OutputQueue>(m, "OutputQueue", "Outputs of many requests, in the order the engine produced them")
      .def(nb::init<>())
      .def(
          "next",
          [](OutputQueue& q, double timeout_s) -> nb::object {
            std::optional<RequestOutput> out;
            {
              nb::gil_scoped_release release;
              out = q.next(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
            }
            if (!out) return nb::none();
            return to_python(*out);
          },
          nb::arg("timeout_s"), "The next output (a dict), or None when timeout_s passes first")
      .def("__len__", &OutputQueue::size);

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
             const std::vector<std::string>& sampling_json, std::shared_ptr<OutputQueue> sink) {
            if (ids.size() != prompts.size() || ids.size() != sampling_json.size())
              throw pagellm::InvalidRequest("submit: ids, prompts and sampling parameters differ in length");
            std::vector<pagellm::EngineRequest> reqs;
            reqs.reserve(ids.size());
            for (size_t i = 0; i < ids.size(); ++i)
              reqs.push_back(e.make_request(ids[i], std::move(prompts[i]),
                                            parse_json(sampling_json[i], "sampling parameters")));
            e.submit(std::move(reqs), std::move(sink));
          },
          nb::arg("ids"), nb::arg("prompts"), nb::arg("sampling_json"), nb::arg("sink"),
          "Queues requests (all or none); their outputs go to `sink`")
      .def("abort", &EmbeddedEngine::abort, nb::arg("request_id"))
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
