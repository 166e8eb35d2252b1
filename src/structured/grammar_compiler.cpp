// GrammarCompiler: worker threads, each running one compile at a time in a
// child process (core/bounded_child.h) under the time and memory budget. The
// child converts the spec, compiles it against the vocabulary, checks that
// some token can start an output, and sends the compiled grammar back as
// xgrammar's JSON serialization; the parent rebuilds it against its own
// TokenizerInfo. Killing the child is how a compile is cancelled (its client
// left, the engine is stopping) or stopped at its budget; the memory the
// compile took goes back to the system with the process.
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "structured/grammar.h"
#include "structured/xgrammar_bridge.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::structured {
namespace {

using Error = CompileResult::Error;

std::string cache_key(const StructuredOutputs& s) {
  std::string key;
  key.reserve(s.spec.size() + 2);
  key += static_cast<char>('0' + static_cast<int>(s.kind));
  key += s.any_whitespace ? '1' : '0';
  key += s.spec;
  return key;
}

// xgrammar wants the vocabulary as the bytes each token stands for; control
// and unknown tokens are "" (never part of a sentence).
xgrammar::TokenizerInfo make_tokenizer_info(const Tokenizer& tok, int32_t vocab_size,
                                            const std::vector<int32_t>& stop_ids) {
  std::vector<std::string> vocab(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    if (!tok.is_special(id)) vocab[id] = tok.token_to_piece(id, false);
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, std::max(vocab_size, tok.vocab_size()), stop_ids);
}

// The child's failures, as the first byte of its message.
constexpr char kInvalid = 'I', kEmpty = 'E';

// Threads for one compile's token-mask work, started by the forked child
// (xgrammar makes its pool per compile). Under a sanitizer, one: GCC 12's
// sanitizer allocators take no lock around fork, so a thread the child starts
// could wait forever on an allocator lock another parent thread held at the
// fork (seen under ASan: a 71 ms compile hung to its 10 s budget). glibc's
// malloc is fork-safe, so release builds use up to 4.
int compile_threads() {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return 1;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  return 1;
#endif
#endif
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
}

// Runs in the child: the compiled grammar's JSON, or an exception whose
// message starts with kInvalid / kEmpty.
std::string compile_in_child(const xgrammar::TokenizerInfo& info, const StructuredOutputs& spec) {
  xgrammar::Grammar grammar = [&] {
    try {
      return to_xgrammar(spec, "");
    } catch (const InvalidRequest& e) {
      throw std::runtime_error(std::string(1, kInvalid) + e.what());
    }
  }();
  xgrammar::GrammarCompiler compiler(info, compile_threads(), /*cache_enabled=*/false);
  xgrammar::CompiledGrammar compiled = compiler.CompileGrammar(grammar);
  // A grammar whose language is empty ("[^\\s\\S]", root ::= root "a")
  // allows no token at all, not even a stop token: nothing can be sampled.
  xgrammar::GrammarMatcher matcher(compiled);
  std::vector<int32_t> mask(static_cast<size_t>(bitmask_words(info.GetVocabSize())), 0);
  if (fill_bitmask(matcher, mask.data(), info.GetVocabSize()) && !any_allowed(mask.data(), info.GetVocabSize()))
    throw std::runtime_error(std::string(1, kEmpty) + "no output can satisfy it (its language is empty)");
  return compiled.SerializeJSON();
}

}  // namespace

struct GrammarCompiler::Impl {
  const Tokenizer& tokenizer;
  const int32_t vocab_size;
  const std::vector<int32_t> stop_ids;
  const GrammarCompilerOptions options;

  // One compile; its waiters hold the PendingGrammar, the queue and the
  // in-flight index only weak references to it.
  struct Job {
    std::string key;
    StructuredOutputs spec;
    std::promise<CompileResult> promise;
    std::weak_ptr<PendingGrammar> waiters;
  };
  struct Cached {
    CompileResult result;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;  // position in lru (front: most recent)
  };

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> queue;
  std::unordered_map<std::string, std::shared_ptr<Job>> in_flight;  // queued or compiling, by key
  std::unordered_map<std::string, Cached> cache;
  std::list<std::string> lru;
  size_t cache_bytes = 0;
  bool stopping = false;
  GrammarCompilerStats stats;
  std::once_flag info_once;
  std::optional<xgrammar::TokenizerInfo> info;  // built on first use: the vocabulary scan takes a while
  std::vector<std::thread> workers;

  Impl(const Tokenizer& t, int32_t v, std::vector<int32_t> s, GrammarCompilerOptions o)
      : tokenizer(t), vocab_size(v), stop_ids(std::move(s)), options(std::move(o)) {
    stats.compile_time = Histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
    for (int i = 0; i < std::max(1, options.workers); ++i) workers.emplace_back([this] { run(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    for (std::thread& w : workers) w.join();  // each kills its child within one poll
    for (auto& job : queue) job->promise.set_value(stopped_result());
  }

  static CompileResult stopped_result() {
    CompileResult r;
    r.error_kind = Error::Unavailable;
    r.error = "the grammar compiler is stopping";
    return r;
  }

  const xgrammar::TokenizerInfo& tokenizer_info() {
    std::call_once(info_once, [&] { info.emplace(make_tokenizer_info(tokenizer, vocab_size, stop_ids)); });
    return *info;
  }

  std::shared_ptr<PendingGrammar> compile(const StructuredOutputs& spec) {
    std::string key = cache_key(spec);
    std::lock_guard<std::mutex> lock(mu);
    stats.requests++;
    if (auto it = cache.find(key); it != cache.end()) {
      stats.cache_hits++;
      lru.splice(lru.begin(), lru, it->second.lru);
      std::promise<CompileResult> done;
      done.set_value(it->second.result);
      return std::make_shared<PendingGrammar>(done.get_future().share());
    }
    if (auto it = in_flight.find(key); it != in_flight.end())
      if (auto waiting = it->second->waiters.lock()) {  // join the compile under way
        stats.cache_hits++;
        return waiting;
      }
    auto job = std::make_shared<Job>();
    job->key = key;
    job->spec = spec;
    auto pending = std::make_shared<PendingGrammar>(job->promise.get_future().share());
    job->waiters = pending;
    if (stopping) {
      job->promise.set_value(stopped_result());
      return pending;
    }
    in_flight[key] = job;
    queue.push_back(std::move(job));
    cv.notify_one();
    return pending;
  }

  void run() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
        job = std::move(queue.front());
        queue.pop_front();
        if (job->waiters.expired()) {  // every waiter left while it was queued
          stats.cancelled++;
          in_flight.erase(job->key);
          continue;
        }
        stats.in_progress++;
      }
      CompileResult r = run_one(*job);
      std::lock_guard<std::mutex> lock(mu);
      stats.in_progress--;
      in_flight.erase(job->key);
      if (r.error_kind == Error::None || r.error_kind == Error::Invalid) remember(job->key, r);
      job->promise.set_value(std::move(r));
    }
  }

  CompileResult run_one(Job& job) {
    CompileResult r;
    const xgrammar::TokenizerInfo* info_ptr = nullptr;
    try {
      info_ptr = &tokenizer_info();
    } catch (const std::exception& e) {
      r.error_kind = Error::Internal;
      r.error = fmt::format("cannot prepare the vocabulary for grammars: {}", clean_message(e.what()));
      return r;
    }
    const xgrammar::TokenizerInfo& xinfo = *info_ptr;
    const auto cancelled = [&] {
      if (job.waiters.expired()) return true;
      std::lock_guard<std::mutex> lock(mu);
      return stopping;
    };
    ChildResult child;
    try {
      child = run_bounded_child([&] { return compile_in_child(xinfo, job.spec); }, options.budget, cancelled);
    } catch (const std::exception& e) {
      r.error_kind = Error::Internal;
      r.error = e.what();
      return r;
    }
    const char* kind = kind_name(job.spec.kind);
    {
      std::lock_guard<std::mutex> lock(mu);
      stats.compile_seconds += child.seconds;
      stats.compile_time.observe(child.seconds);
      if (child.status == ChildResult::Status::Ok) {
        stats.compiled++;
      } else {
        stats.failed++;
        if (child.status == ChildResult::Status::OverTime || child.status == ChildResult::Status::OverMemory)
          stats.over_budget++;
        if (child.status == ChildResult::Status::Cancelled) stats.cancelled++;
      }
    }
    switch (child.status) {
      case ChildResult::Status::Ok: {
        auto g = xgrammar::CompiledGrammar::DeserializeJSON(child.output, xinfo);
        if (auto* compiled = std::get_if<xgrammar::CompiledGrammar>(&g)) {
          r.grammar = std::make_shared<CompiledGrammar>(std::move(*compiled));
        } else {
          r.error_kind = Error::Internal;
          std::visit([&](const auto& e) { r.error = clean_message(e.what()); }, std::get<1>(g));
        }
        return r;
      }
      case ChildResult::Status::Failed: {
        // xgrammar refusing what it parsed is about the spec too: the client's
        // error, with xgrammar's reason.
        const std::string& m = child.output;
        r.error_kind = Error::Invalid;
        if (!m.empty() && m[0] == kEmpty) r.error = fmt::format("the {} admits no output: {}", kind, m.substr(1));
        else if (!m.empty() && m[0] == kInvalid) r.error = m.substr(1);
        else r.error = fmt::format("the {} could not be compiled: {}", kind, clean_message(m));
        return r;
      }
      case ChildResult::Status::OverTime:
        r.error_kind = Error::OverBudget;
        r.error = fmt::format("the {} took longer than {:.3g} s to compile (--grammar-compile-timeout); simplify it",
                              kind, static_cast<double>(options.budget.time.count()) / 1000.0);
        return r;
      case ChildResult::Status::OverMemory:
        r.error_kind = Error::OverBudget;
        r.error = fmt::format("the {} needed more than {} MiB to compile (--grammar-compile-memory); simplify it",
                              kind, options.budget.memory_bytes >> 20);
        return r;
      case ChildResult::Status::Cancelled:
        r.error_kind = Error::Unavailable;
        r.error = "the compile was cancelled";
        return r;
      case ChildResult::Status::Crashed: break;
    }
    spdlog::error("grammar compile ({}) failed: {}", kind, child.output);
    r.error_kind = Error::Internal;
    r.error = fmt::format("the {} could not be compiled: {}", kind, child.output);
    return r;
  }

  // Under mu. Compiled grammars and the client's errors are kept (a retry
  // of the same bad spec costs nothing); budget failures are not (they may
  // pass when the machine is less busy).
  void remember(const std::string& key, const CompileResult& r) {
    if (cache.count(key)) return;
    const size_t bytes = r.grammar ? r.grammar->grammar.MemorySizeBytes() : r.error.size();
    if (bytes > options.cache_bytes) return;
    lru.push_front(key);
    cache.emplace(key, Cached{r, bytes, lru.begin()});
    cache_bytes += bytes;
    bool evicted = false;
    while (cache.size() > std::max<size_t>(1, options.cache_entries) || cache_bytes > options.cache_bytes) {
      auto it = cache.find(lru.back());
      cache_bytes -= it->second.bytes;
      cache.erase(it);
      lru.pop_back();
      evicted = true;
    }
    // A compiled grammar is many small allocations; give the pages back
    // (matchers that still use an evicted grammar keep their own reference).
    if (evicted) malloc_trim(0);
  }
};

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int32_t vocab_size, std::vector<int32_t> stop_ids,
                                 GrammarCompilerOptions options)
    : vocab_size_(std::max(vocab_size, tokenizer.vocab_size())),
      options_(options),
      impl_(std::make_unique<Impl>(tokenizer, vocab_size_, std::move(stop_ids), std::move(options))) {}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<PendingGrammar> GrammarCompiler::compile(const StructuredOutputs& spec) { return impl_->compile(spec); }

GrammarCompilerStats GrammarCompiler::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  GrammarCompilerStats s = impl_->stats;
  s.cached = impl_->cache.size();
  s.cached_bytes = impl_->cache_bytes;
  s.queued = static_cast<int64_t>(impl_->queue.size());
  return s;
}

}  // namespace pagellm::structured
