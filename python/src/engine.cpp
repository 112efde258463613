// _Engine: the serving engine. Events are queued in C++ while step() runs without the GIL and handed to Python
// afterwards (take_events), so no Python code runs inside the engine.
#include <pybind11/stl.h>

#include <mutex>
#include <optional>

#include "errors.h"
#include "handles.h"
#include "mambacpp/engine.h"
#include "mambacpp/grammar.h"

namespace py = pybind11;

namespace mambacpp::python {

namespace {

struct Event {
  RequestId id = 0;
  std::optional<GeneratedToken> token;
  std::string text;
  bool finished = false;
  std::optional<GenerateResult> result;
  int64_t prompt_done = 0;
};

struct PyEngine {
  std::shared_ptr<Model> model;          // declared before the engine: destroyed after it
  std::shared_ptr<Model> draft_model;    // may be null; as `model`
  std::shared_ptr<Tokenizer> tokenizer;  // may be null
  std::mutex mu;
  std::vector<Event> events;
  std::unique_ptr<Engine> engine;

  void push(Event&& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(e));
  }
};

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<SamplingParams>(m, "_SamplingParams")
      .def(py::init<>())
      .def_readwrite("temperature", &SamplingParams::temperature)
      .def_readwrite("top_k", &SamplingParams::top_k)
      .def_readwrite("top_p", &SamplingParams::top_p)
      .def_readwrite("min_p", &SamplingParams::min_p)
      .def_readwrite("repeat_penalty", &SamplingParams::repeat_penalty)
      .def_readwrite("repeat_last_n", &SamplingParams::repeat_last_n)
      .def_readwrite("presence_penalty", &SamplingParams::presence_penalty)
      .def_readwrite("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_readwrite("seed", &SamplingParams::seed)
      .def_readwrite("seed_given", &SamplingParams::seed_given)
      .def("validate", [](const SamplingParams& p) { input_errors([&] { p.validate(); }); });

  py::class_<TokenLogprob>(m, "TokenLogprob")
      .def_readonly("id", &TokenLogprob::id)
      .def_readonly("logprob", &TokenLogprob::logprob);
  py::class_<GeneratedToken>(m, "GeneratedToken")
      .def_readonly("id", &GeneratedToken::id)
      .def_readonly("logprob", &GeneratedToken::logprob)
      .def_readonly("top", &GeneratedToken::top);
  py::class_<GenerateResult>(m, "GenerateResult")
      .def_readonly("id", &GenerateResult::id)
      .def_readonly("tokens", &GenerateResult::tokens)
      .def_readonly("token_info", &GenerateResult::token_info)
      .def_property_readonly("text", [](const GenerateResult& r) { return utf8_replace(r.text); })
      .def_property_readonly("text_bytes", [](const GenerateResult& r) { return py::bytes(r.text); })
      .def_property_readonly("finish_reason", [](const GenerateResult& r) { return std::string(finish_reason_name(r.finish_reason)); })
      .def_readonly("prompt_tokens", &GenerateResult::prompt_tokens)
      .def_readonly("cached_prompt_tokens", &GenerateResult::cached_prompt_tokens)
      .def_readonly("seed", &GenerateResult::seed)
      .def_readonly("draft_tokens", &GenerateResult::draft_tokens)
      .def_readonly("accepted_draft_tokens", &GenerateResult::accepted_draft_tokens)
      .def_property_readonly("queue_ms", [](const GenerateResult& r) { return r.timings.queue_ms; })
      .def_property_readonly("prompt_ms", [](const GenerateResult& r) { return r.timings.prompt_ms; })
      .def_property_readonly("generate_ms", [](const GenerateResult& r) { return r.timings.generate_ms; })
      .def_readonly("error", &GenerateResult::error)
      .def("__repr__", [](const GenerateResult& r) {
        return "GenerateResult(id=" + std::to_string(r.id) + ", tokens=" + std::to_string(r.tokens.size()) +
               ", finish_reason='" + finish_reason_name(r.finish_reason) + "')";
      });
  py::class_<Event>(m, "RequestEvent")
      .def_readonly("id", &Event::id)
      .def_readonly("token", &Event::token)
      .def_property_readonly("text", [](const Event& e) { return utf8_replace(e.text); })
      .def_readonly("finished", &Event::finished)
      .def_readonly("result", &Event::result)
      .def_readonly("prompt_done", &Event::prompt_done);

  // Constrained output (mambacpp/grammar.h): a schema feature not supported is bad input naming it.
  m.def("_json_object_grammar", [] { return json_object_grammar(); });
  m.def("_json_schema_to_grammar",
        [](const std::string& schema) { return input_errors([&] { return json_schema_to_grammar(schema); }); },
        py::arg("schema"));

  // EngineOptions' defaults, so that the Python Engine follows the C++ ones.
  m.def("_engine_defaults", [] {
    const EngineOptions o;
    py::dict d;
    d["max_seqs"] = o.max_seqs, d["max_queue"] = o.max_queue, d["batch_tokens"] = o.batch_tokens;
    d["max_prompt"] = o.max_prompt, d["max_new_tokens"] = o.max_new_tokens, d["state_cache_mb"] = o.state_cache_mb;
    d["state_checkpoint_interval"] = o.state_checkpoint_interval;
    d["state_dtype"] = std::string(dtype_name(o.state_dtype)), d["device_sampling"] = o.device_sampling;
    return d;
  });

  py::class_<PyEngine>(m, "_Engine")
      .def(py::init([](const std::shared_ptr<Model>& model, const std::shared_ptr<Tokenizer>& tokenizer,
                       int64_t max_seqs, int64_t max_queue, int64_t batch_tokens, int64_t max_prompt,
                       int64_t max_new_tokens, int64_t state_cache_mb, int64_t state_checkpoint_interval,
                       const std::string& state_dtype, bool device_sampling,
                       const std::shared_ptr<Model>& draft_model, const std::string& state_cache_dir,
                       int64_t state_cache_disk_mb, bool draft_mtp) {
             EngineOptions o;
             o.max_seqs = max_seqs;
             o.max_queue = max_queue;
             o.batch_tokens = batch_tokens;
             o.max_prompt = max_prompt;
             o.max_new_tokens = max_new_tokens;
             o.state_cache_mb = state_cache_mb;
             o.state_cache_dir = state_cache_dir;
             o.state_cache_disk_mb = state_cache_disk_mb;
             o.state_checkpoint_interval = state_checkpoint_interval;
             o.device_sampling = device_sampling;
             auto e = std::make_unique<PyEngine>();
             e->model = model;
             e->tokenizer = tokenizer;
             e->draft_model = draft_model;
             o.draft_model = draft_model.get();
             o.draft_mtp = draft_mtp;
             input_errors([&] {
               o.state_dtype = parse_dtype(state_dtype);
               e->engine = std::make_unique<Engine>(*model, tokenizer.get(), o);
             });
             return e;
           }),
           py::arg("model"), py::arg("tokenizer"), py::arg("max_seqs"), py::arg("max_queue"), py::arg("batch_tokens"),
           py::arg("max_prompt"), py::arg("max_new_tokens"), py::arg("state_cache_mb"),
           py::arg("state_checkpoint_interval"), py::arg("state_dtype"), py::arg("device_sampling"),
           py::arg("draft_model"), py::arg("state_cache_dir"), py::arg("state_cache_disk_mb"), py::arg("draft_mtp"))
      // stream: every event is queued (tokens and text); otherwise only the finished one. The id is appended to
      // `submitted` before this returns, so that Python holds it even when Ctrl-C is raised as the call returns
      // (CPython checks for signals then): Engine.submit cancels it.
      .def("submit",
           [](PyEngine& e, std::vector<int32_t> prompt, int max_new_tokens, const SamplingParams& sampling,
              std::vector<int32_t> stop_tokens, std::vector<std::string> stop_strings, bool ignore_eos, int logprobs,
              const std::string& save_state, int draft_ngram, bool draft_model, int draft_max, bool draft_adaptive,
              const std::string& grammar, bool stream, py::list submitted, bool draft_mtp) {
             GenerateRequest r;
             r.prompt = std::move(prompt);
             r.max_new_tokens = max_new_tokens;
             r.sampling = sampling;
             r.stop_tokens = std::move(stop_tokens);
             r.stop_strings = std::move(stop_strings);
             r.ignore_eos = ignore_eos;
             r.logprobs = logprobs;
             r.save_state = save_state;
             r.speculative.draft_ngram = draft_ngram;
             r.speculative.draft_model = draft_model;
             r.speculative.draft_mtp = draft_mtp;
             r.speculative.draft_max = draft_max;
             r.speculative.adaptive = draft_adaptive;
             r.grammar = grammar;
             PyEngine* self = &e;
             r.on_event = [self, stream](const RequestEvent& ev) {
               if (!stream && !ev.finished) return;
               Event out;
               out.id = ev.id;
               if (ev.token) out.token = *ev.token;
               out.text = std::string(ev.text);
               out.finished = ev.finished;
               out.prompt_done = ev.prompt_done;
               if (ev.result) out.result = *ev.result;
               self->push(std::move(out));
             };
             const RequestId id = input_errors([&] { return e.engine->submit(std::move(r)); });
             try {
               submitted.append(id);
             } catch (...) {  // (out of memory) nobody could cancel it otherwise
               e.engine->cancel(id);
               throw;
             }
           },
           py::arg("prompt"), py::arg("max_new_tokens"), py::arg("sampling"), py::arg("stop_tokens"),
           py::arg("stop_strings"), py::arg("ignore_eos"), py::arg("logprobs"), py::arg("save_state"),
           py::arg("draft_ngram"), py::arg("draft_model"), py::arg("draft_max"), py::arg("draft_adaptive"),
           py::arg("grammar"), py::arg("stream"), py::arg("submitted"), py::arg("draft_mtp"))
      .def("cancel", [](PyEngine& e, RequestId id) { return input_errors([&] { return e.engine->cancel(id); }); },
           py::arg("id"))
      .def("step", [](PyEngine& e) { return e.engine->step(); }, py::call_guard<py::gil_scoped_release>())
      .def("wait_for_work", [](PyEngine& e, int64_t timeout_ms) { return e.engine->wait_for_work(timeout_ms); },
           py::arg("timeout_ms"), py::call_guard<py::gil_scoped_release>())
      .def("take_events",
           [](PyEngine& e) {
             std::vector<Event> out;
             std::lock_guard<std::mutex> lock(e.mu);
             out.swap(e.events);
             return out;
           })
      .def("load_state", [](PyEngine& e, const std::string& path) { return file_errors([&] { return e.engine->load_state(path); }); },
           py::arg("path"))
      .def("clear_cache", [](PyEngine& e) { e.engine->clear_cache(); })
      .def("stats", [](const PyEngine& e) {
        const EngineStats s = e.engine->stats();
        py::dict d;
        d["running"] = s.running, d["running_peak"] = s.running_peak, d["queued"] = s.queued;
        d["cache_entries"] = s.cache_entries;
        d["cache_bytes"] = s.cache_bytes, d["cache_budget_bytes"] = s.cache_budget_bytes;
        d["cache_hits"] = s.cache_hits, d["cache_misses"] = s.cache_misses, d["cached_tokens"] = s.cached_tokens;
        d["draft_tokens"] = s.draft_tokens, d["accepted_draft_tokens"] = s.accepted_draft_tokens;
        d["verify_steps"] = s.verify_steps;
        d["steps"] = s.steps;
        return d;
      });
}

}  // namespace mambacpp::python
