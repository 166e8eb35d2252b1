// Randomized simulation: many sequences with shared prefixes, random lengths,
// parallel sampling (forks), random aborts, a small KV pool. A fake model
// writes, for every token it computes, a value standing for the token's whole
// prefix into that token's KV slot, and checks that every position a sequence
// attends to holds its own prefix's value. That catches wrong prefix-cache
// hits, missing copy-on-write, writes into shared blocks and lost blocks; with
// swap preemption, it moves the values to a host pool and back as the plan
// says, which catches a swap that reads or restores the wrong blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "scheduler/scheduler.h"

namespace pagellm {
namespace {

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ULL + b + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct SimSeq {
  std::unique_ptr<Sequence> seq;
  uint64_t seed = 0;
  int32_t max_tokens = 0;
  bool wants_fork = false;
  bool forked = false;
  bool done = false;
  std::vector<uint64_t> prefix_value;  // [num_tokens]: stands for token_ids[0..p]

  TokenId sampled(int32_t k) const { return static_cast<TokenId>(mix(seed, k) % 50); }
  uint64_t value_at(int32_t pos) {
    while (static_cast<int32_t>(prefix_value.size()) <= pos) {
      const size_t p = prefix_value.size();
      prefix_value.push_back(mix(p ? prefix_value[p - 1] : 7, static_cast<uint64_t>(seq->token_ids[p])));
    }
    return prefix_value[pos];
  }
};

struct SimParams {
  uint32_t seed;
  int32_t block_size;
  int32_t num_blocks;
  int32_t budget;
  int32_t max_num_seqs;
  bool chunked;
  bool prefix;
  SchedulingPolicy policy;
  AllocationPolicy placement;
  int32_t swap_blocks = 0;  // > 0: swap preemption with a host pool of this many blocks
};

class Simulation {
 public:
  explicit Simulation(const SimParams& p)
      : p_(p), rng_(p.seed), sched_(make_sched_config(p), make_kv_config(p)),
        memory_(static_cast<size_t>(p.num_blocks) * p.block_size, 0),
        host_(static_cast<size_t>(p.swap_blocks) * p.block_size, 0) {
    for (int i = 0; i < 4; ++i) {
      std::vector<TokenId> base(static_cast<size_t>(uniform(0, 60)));
      for (auto& t : base) t = uniform(0, 49);
      bases_.push_back(base);
    }
  }

  static SchedulerConfig make_sched_config(const SimParams& p) {
    SchedulerConfig c;
    c.max_model_len = kMaxModelLen;
    c.max_num_batched_tokens = p.chunked ? p.budget : std::max(p.budget, kMaxModelLen);
    c.max_num_seqs = p.max_num_seqs;
    c.enable_chunked_prefill = p.chunked;
    c.policy = p.policy;
    c.preemption_mode = p.swap_blocks > 0 ? PreemptionMode::Swap : PreemptionMode::Recompute;
    c.num_swap_blocks = p.swap_blocks;
    return c;
  }
  static KVCacheConfig make_kv_config(const SimParams& p) {
    KVCacheConfig c;
    c.num_blocks = p.num_blocks;
    c.block_size = p.block_size;
    c.enable_prefix_caching = p.prefix;
    c.allocation_policy = p.placement;
    return c;
  }

  void run() {
    const int32_t total = 60;
    int32_t added = 0, steps = 0;
    while ((added < total || sched_.has_unfinished()) && steps < 20000) {
      for (int k = uniform(0, 3); k > 0 && added < total; --k, ++added) add_random();
      step();
      ++steps;
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_FALSE(sched_.has_unfinished()) << "not done after " << steps << " steps";
    check_outputs();
    const KVCacheStats st = sched_.kv_stats();
    EXPECT_EQ(st.used_blocks, 0);
    EXPECT_EQ(st.used_blocks + st.cached_blocks + st.free_blocks, p_.num_blocks - 1);
    if (!p_.prefix) {
      EXPECT_EQ(st.cached_blocks, 0);
    }
    preemptions_ = sched_.num_preemptions();
    fair_ = sched_.num_preemptions_fair();
    swaps_ = sched_.num_preemptions_swap();
    EXPECT_EQ(sched_.num_blocks_swapped_out(), sched_.num_blocks_swapped_in() + swapped_out_of_aborted_);
    EXPECT_EQ(sched_.num_free_swap_blocks(), p_.swap_blocks);
    hits_ = st.prefix_hit_tokens;
  }

  int64_t preemptions_ = 0;
  int64_t fair_ = 0;
  int64_t swaps_ = 0;
  int64_t swapped_out_of_aborted_ = 0;  // blocks of sequences aborted while swapped out
  int64_t hits_ = 0;
  int64_t copies_ = 0;
  int64_t aborted_ = 0;

 private:
  static constexpr int32_t kMaxModelLen = 128;

  int32_t uniform(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng_); }

  SimSeq& new_seq(SeqId id) {
    SimSeq& s = seqs_[id];
    s.seq = std::make_unique<Sequence>();
    s.seq->id = id;
    s.seed = mix(p_.seed, id);
    s.max_tokens = uniform(1, 40);
    return s;
  }

  void add_random() {
    SimSeq& s = new_seq(next_id_++);
    std::vector<TokenId> prompt = bases_[uniform(0, 3)];
    prompt.resize(std::min<size_t>(prompt.size(), uniform(0, 60)));
    for (int k = uniform(prompt.empty() ? 1 : 0, 50); k > 0; --k) prompt.push_back(uniform(0, 49));
    s.seq->request_id = s.seq->id;
    s.seq->priority = uniform(0, 3);
    s.seq->num_prompt_tokens = static_cast<int32_t>(prompt.size());
    s.seq->token_ids = std::move(prompt);
    s.wants_fork = uniform(0, 4) == 0;
    sched_.add(s.seq.get());
  }

  std::vector<int64_t> slots_of(const ScheduledSeq& e, int32_t from, int32_t to) const {
    std::vector<int64_t> out;
    for (int32_t pos = from; pos < to; ++pos) out.push_back(StepPlan::slot_of(e.block_table, pos, p_.block_size));
    return out;
  }

  void step() {
    // Sequences one token behind must run this step (unless preempted) when
    // the budget covers them all: decodes never stall.
    std::set<SeqId> decodes;
    for (const Sequence* s : sched_.running()) {
      if (s->num_tokens() - s->num_computed_tokens == 1) decodes.insert(s->id);
    }
    const int32_t budget = sched_.config().max_num_batched_tokens;

    const StepPlan plan = sched_.schedule();
    ASSERT_NO_THROW(sched_.check_invariants());
    int32_t total = 0;
    std::set<SeqId> in_plan;
    for (const auto& e : plan.seqs) {
      ASSERT_TRUE(in_plan.insert(e.seq_id).second) << "sequence twice in a plan";
      ASSERT_EQ(e.seq->status, SeqStatus::Running);
      ASSERT_EQ(e.start_pos, e.seq->num_computed_tokens);
      ASSERT_GT(e.num_new_tokens, 0);
      ASSERT_LE(e.end_pos(), e.seq->num_tokens());
      ASSERT_LE(e.end_pos(), kMaxModelLen);
      ASSERT_EQ(e.sample, e.end_pos() == e.seq->num_tokens());
      ASSERT_GE(static_cast<int64_t>(e.block_table.size()) * p_.block_size, e.end_pos());
      if (!p_.chunked) {
        ASSERT_EQ(e.end_pos(), e.seq->num_tokens()) << "prompt split without chunking";
      }
      total += e.num_new_tokens;
    }
    ASSERT_EQ(total, plan.num_batched_tokens);
    ASSERT_LE(total, budget);
    if (static_cast<int32_t>(decodes.size()) <= budget) {
      for (SeqId id : decodes) {
        const bool ran = in_plan.count(id) != 0;
        const bool preempted = std::count(plan.preempted.begin(), plan.preempted.end(), id) != 0;
        ASSERT_TRUE(ran || preempted) << "decode of sequence " << id << " stalled";
      }
    }
    for (SeqId id : plan.preempted) {
      const bool swapped = std::count(plan.swapped_out.begin(), plan.swapped_out.end(), id) != 0;
      ASSERT_EQ(seqs_[id].seq->status, swapped ? SeqStatus::Swapped : SeqStatus::Preempted);
    }
    if (p_.swap_blocks == 0) ASSERT_TRUE(plan.swap_out.empty() && plan.swap_in.empty());
    // The runner swaps out before it swaps in: a host block read back this
    // step must not be a victim's destination too.
    for (const BlockCopy& in : plan.swap_in) {
      for (const BlockCopy& out : plan.swap_out) {
        ASSERT_NE(in.src, out.dst) << "host block reused within a step";
      }
    }

    // The fake forward pass: swaps and copies first (in the runner's order),
    // then each token's K/V, then reads.
    const size_t bs = static_cast<size_t>(p_.block_size);
    for (const BlockCopy& c : plan.swap_out) std::copy_n(&memory_[c.src * bs], bs, &host_[c.dst * bs]);
    for (const BlockCopy& c : plan.swap_in) std::copy_n(&host_[c.src * bs], bs, &memory_[c.dst * bs]);
    for (const BlockCopy& c : plan.block_copies) {
      std::copy_n(&memory_[size_t(c.src) * p_.block_size], p_.block_size, &memory_[size_t(c.dst) * p_.block_size]);
      ++copies_;
    }
    for (const auto& e : plan.seqs) {
      SimSeq& s = seqs_[e.seq_id];
      const auto slots = slots_of(e, e.start_pos, e.end_pos());
      for (int32_t i = 0; i < e.num_new_tokens; ++i) {
        const BlockId b = static_cast<BlockId>(slots[i] / p_.block_size);
        ASSERT_NE(b, kNullBlock);
        ASSERT_EQ(sched_.kv().pool().ref_count(b), 1) << "write into a shared block " << b;
        memory_[slots[i]] = s.value_at(e.start_pos + i);
      }
    }
    for (const auto& e : plan.seqs) {
      SimSeq& s = seqs_[e.seq_id];
      const auto slots = slots_of(e, 0, e.end_pos());
      for (int32_t pos = 0; pos < e.end_pos(); ++pos) {
        ASSERT_EQ(memory_[slots[pos]], s.value_at(pos))
            << "sequence " << e.seq_id << " reads a wrong K/V at position " << pos;
      }
    }

    // Sample, report, stop checks, forks, aborts: the engine's part.
    for (const auto& e : plan.seqs) {
      if (!e.sample) continue;
      SimSeq& s = seqs_[e.seq_id];
      s.seq->token_ids.push_back(s.sampled(s.seq->num_output_tokens()));
    }
    sched_.on_step_done(plan);
    ASSERT_NO_THROW(sched_.check_invariants());
    for (SeqId id : plan.length_capped) ADD_FAILURE() << "sequence " << id << " hit the length cap";
    for (const auto& e : plan.seqs) {
      SimSeq& s = seqs_[e.seq_id];
      if (!e.sample || s.seq->status != SeqStatus::Running) continue;
      if (s.wants_fork && !s.forked && s.seq->num_output_tokens() == 1) fork(s);
      if (s.seq->num_output_tokens() >= s.max_tokens || sched_.reached_max_model_len(*s.seq)) {
        ASSERT_TRUE(sched_.finish(e.seq_id, SeqStatus::FinishedStopped));
        s.done = true;
      }
    }
    if (uniform(0, 30) == 0 && sched_.has_unfinished()) {
      std::vector<SeqId> live;
      for (const Sequence* s : sched_.running()) live.push_back(s->id);
      for (const Sequence* s : sched_.waiting()) live.push_back(s->id);
      for (const Sequence* s : sched_.swapped()) live.push_back(s->id);
      const SeqId victim = live[uniform(0, static_cast<int32_t>(live.size()) - 1)];
      if (seqs_[victim].seq->status == SeqStatus::Swapped)
        swapped_out_of_aborted_ += (seqs_[victim].seq->num_computed_tokens + p_.block_size - 1) / p_.block_size;
      const int32_t used_before = sched_.kv_stats().used_blocks;
      const int32_t held = static_cast<int32_t>(sched_.kv().block_table(victim).size());
      ASSERT_TRUE(sched_.abort(victim));
      ASSERT_LE(sched_.kv_stats().used_blocks, used_before);
      if (held == 0) {
        ASSERT_EQ(sched_.kv_stats().used_blocks, used_before);
      }
      seqs_[victim].done = true;
      ++aborted_;
    }
    ASSERT_NO_THROW(sched_.check_invariants());
  }

  // n = 2..5: children beyond the free seats wait (fairness between requests
  // then decides who runs).
  void fork(SimSeq& parent) {
    parent.forked = true;
    for (int k = uniform(1, 4); k > 0; --k) {
      SimSeq& child = new_seq(next_id_++);
      child.max_tokens = parent.max_tokens;
      const Sequence& p = *parent.seq;
      child.seq->request_id = p.request_id;
      child.seq->priority = p.priority;
      child.seq->num_prompt_tokens = p.num_prompt_tokens;
      child.seq->token_ids.assign(p.token_ids.begin(), p.token_ids.begin() + p.num_prompt_tokens);
      child.seq->token_ids.push_back(child.sampled(0));
      sched_.fork(p.id, child.seq.get());
      ASSERT_LE(sched_.num_running(), p_.max_num_seqs);
      // Its first token may already end it, like any sampled token.
      if (child.max_tokens == 1 || sched_.reached_max_model_len(*child.seq)) {
        ASSERT_TRUE(sched_.finish(child.seq->id, SeqStatus::FinishedStopped));
        child.done = true;
      }
    }
  }

  void check_outputs() {
    for (auto& [id, s] : seqs_) {
      const Sequence& q = *s.seq;
      ASSERT_TRUE(q.finished()) << "sequence " << id << " is " << to_string(q.status);
      // Generation stops at max_tokens or when the context is full.
      const int32_t expected_out =
          std::min(s.max_tokens, std::max(1, kMaxModelLen - q.num_prompt_tokens));
      std::vector<TokenId> expected(q.token_ids.begin(), q.token_ids.begin() + q.num_prompt_tokens);
      for (int32_t k = 0; k < expected_out; ++k) expected.push_back(s.sampled(k));
      if (q.status == SeqStatus::FinishedAborted) {
        ASSERT_LE(q.token_ids.size(), expected.size());
        ASSERT_TRUE(std::equal(q.token_ids.begin(), q.token_ids.end(), expected.begin())) << id;
      } else {
        ASSERT_EQ(q.token_ids, expected) << "sequence " << id << " prompt " << q.num_prompt_tokens
                                         << " tokens " << q.token_ids.size() << " expected " << expected.size()
                                         << " status " << to_string(q.status) << " parent " << q.parent.value_or(0);
      }
    }
  }

  SimParams p_;
  std::mt19937 rng_;
  Scheduler sched_;
  std::vector<uint64_t> memory_;  // [num_blocks * block_size]: one value per KV slot
  std::vector<uint64_t> host_;    // [swap_blocks * block_size]: the host pool
  std::vector<std::vector<TokenId>> bases_;
  std::map<SeqId, SimSeq> seqs_;
  SeqId next_id_ = 1;
};

TEST(SchedulerSimulation, RandomWorkloadsRunToCompletion) {
  // Pools hold 1.5 - 3 max-length sequences, so preemption is frequent.
  const SimParams cases[] = {
      {1, 8, 25, 64, 8, true, true, SchedulingPolicy::Fcfs, AllocationPolicy::Any},
      {2, 16, 13, 32, 16, true, true, SchedulingPolicy::Priority, AllocationPolicy::Contiguous},
      {3, 8, 33, 256, 4, false, true, SchedulingPolicy::Fcfs, AllocationPolicy::Contiguous},
      {4, 16, 25, 16, 32, true, false, SchedulingPolicy::Fcfs, AllocationPolicy::Any},
      {5, 32, 7, 100, 8, true, true, SchedulingPolicy::Priority, AllocationPolicy::Any},
      {6, 8, 17, 128, 16, false, false, SchedulingPolicy::Priority, AllocationPolicy::Any},
      {7, 64, 4, 48, 6, true, true, SchedulingPolicy::Fcfs, AllocationPolicy::Contiguous},
      {8, 8, 49, 512, 64, true, true, SchedulingPolicy::Fcfs, AllocationPolicy::Any},
  };
  // PAGELLM_SCHED_SIM_ROUNDS=N reruns the cases with N sets of seeds (soak test).
  const char* rounds_env = std::getenv("PAGELLM_SCHED_SIM_ROUNDS");
  const int rounds = rounds_env ? std::max(1, std::atoi(rounds_env)) : 1;
  int64_t preemptions = 0, fair = 0, hits = 0, copies = 0, aborted = 0;
  for (int round = 0; round < rounds; ++round)
  for (SimParams p : cases) {
    p.seed += 1000u * static_cast<uint32_t>(round);
    SCOPED_TRACE(::testing::Message() << "case seed " << p.seed);
    Simulation sim(p);
    sim.run();
    if (::testing::Test::HasFatalFailure()) return;
    preemptions += sim.preemptions_;
    fair += sim.fair_;
    hits += sim.hits_;
    copies += sim.copies_;
    aborted += sim.aborted_;
  }
  // The workload must actually exercise the paths it is meant to test.
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(fair, 0);
  EXPECT_GT(hits, 0);
  EXPECT_GT(copies, 0);
  EXPECT_GT(aborted, 0);
  RecordProperty("preemptions", std::to_string(preemptions));
  RecordProperty("fair_preemptions", std::to_string(fair));
  RecordProperty("prefix_hit_tokens", std::to_string(hits));
  RecordProperty("block_copies", std::to_string(copies));
  RecordProperty("aborts", std::to_string(aborted));
}

// Swap preemption under the same random workloads: the fake model checks
// that every swapped-in sequence reads back its own values. A host pool of
// 64 blocks takes every victim; one of 3 blocks overflows, so victims fall
// back to recompute, and both kinds of preemption mix in one run.
TEST(SchedulerSimulation, SwapPreemptionRestoresTheRightBlocks) {
  const SimParams cases[] = {
      {11, 8, 25, 64, 8, true, true, SchedulingPolicy::Fcfs, AllocationPolicy::Any, 64},
      {12, 16, 13, 32, 16, true, true, SchedulingPolicy::Priority, AllocationPolicy::Contiguous, 64},
      {13, 8, 33, 256, 4, false, false, SchedulingPolicy::Fcfs, AllocationPolicy::Any, 64},
      {14, 8, 25, 64, 8, true, true, SchedulingPolicy::Fcfs, AllocationPolicy::Any, 3},
      {15, 8, 49, 512, 64, true, true, SchedulingPolicy::Priority, AllocationPolicy::Any, 3},
  };
  int64_t swaps = 0, recomputes = 0;
  for (const SimParams& p : cases) {
    SCOPED_TRACE(::testing::Message() << "case seed " << p.seed << " host blocks " << p.swap_blocks);
    Simulation sim(p);
    sim.run();
    if (::testing::Test::HasFatalFailure()) return;
    swaps += sim.swaps_;
    recomputes += sim.preemptions_ - sim.swaps_;
  }
  EXPECT_GT(swaps, 0);
  EXPECT_GT(recomputes, 0) << "the small host pool never overflowed";
  RecordProperty("swap_preemptions", std::to_string(swaps));
  RecordProperty("recompute_preemptions", std::to_string(recomputes));
}

}  // namespace
}  // namespace pagellm
