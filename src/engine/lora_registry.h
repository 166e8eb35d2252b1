// LoraRegistry: the engine's LoRA adapters by name (--lora-modules, and
// /v1/load_lora_adapter at run time), their host copies (at most
// max_cpu_loras kept while unused, least recently used dropped first and
// read again when asked for), and the model's max_loras device slots, given
// to the adapters of each step (a free slot, else the least recently used
// one the step does not need). Requests hold their adapter through a
// LoraLease; an adapter unloaded while requests use it stays until the last
// one finishes. Runs on the step thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/lora.h"
#include "model/model.h"
#include "scheduler/step_plan.h"

namespace pagellm {

struct LoraModule {
  std::string name, path;
};

struct LoraConfig {
  bool enabled = false;         // --enable-lora
  int32_t max_loras = 1;        // adapters in one step (device slots)
  int32_t max_lora_rank = 16;   // the slots' rank
  int32_t max_cpu_loras = 0;    // unused adapters kept in host memory; 0: max_loras
  std::optional<DType> dtype;   // the device slots' (--lora-dtype); nullopt: auto (Model::enable_lora)
  std::vector<LoraModule> modules;  // loaded at start
  void validate() const;        // throws Error naming the bad flag
};

// What /v1/models and the metrics show of an adapter.
struct LoraInfo {
  std::string name, path;
  int32_t id = 0, rank = 0;
  int32_t requests = 0;  // unfinished requests using it
  int32_t slot = 0;      // its device slot now (0: none)
};

class LoraRegistry;

// A request's hold on its adapter (released when the request is destroyed).
class LoraLease {
 public:
  LoraLease(LoraRegistry& registry, int32_t id) : registry_(registry), id_(id) {}
  ~LoraLease();
  LoraLease(const LoraLease&) = delete;
  LoraLease& operator=(const LoraLease&) = delete;
  int32_t id() const { return id_; }

 private:
  LoraRegistry& registry_;
  int32_t id_;
};

class LoraRegistry {
 public:
  LoraRegistry(Model& model, const LoraConfig& config);

  // Reads and checks the adapter, then serves it as `name`. Throws
  // InvalidRequest when the name is taken, Error for a file that does not fit.
  void load(const std::string& name, const std::string& path);
  // Stops serving `name` (requests using it finish with it); false: unknown.
  bool unload(const std::string& name);
  bool has(const std::string& name) const { return names_.count(name) > 0; }
  // A hold on the named adapter for a new request (its host copy read again
  // if it was dropped). Throws InvalidRequest (param "model") for an unknown name.
  std::unique_ptr<LoraLease> acquire(const std::string& name);
  // Before a step runs: each entry's lora_slot, loading adapters into slots
  // as needed (the scheduler keeps a step within max_loras adapters).
  void assign_slots(StepPlan& plan);

  std::vector<LoraInfo> list() const;  // served adapters, in load order
  std::string name_of(int32_t id) const;
  std::string path_of(int32_t id) const;  // the adapter's file or folder ("" for an unknown id)
  const LoraConfig& config() const { return config_; }
  int64_t slot_loads() const { return slot_loads_; }  // adapters copied into a slot so far

 private:
  friend class LoraLease;
  struct Entry {
    std::string name, path;
    std::shared_ptr<const LoraAdapter> host;  // null: dropped from host memory
    int32_t rank = 0;
    int32_t refs = 0;
    bool unloaded = false;
    int32_t slot = 0;
    uint64_t last_used = 0;
  };
  void release(int32_t id);
  void forget(int32_t id);  // an unloaded adapter's last request finished
  void trim_host();
  int32_t slot_for(int32_t id);

  Model& model_;
  LoraConfig config_;
  std::unordered_map<int32_t, Entry> entries_;
  std::unordered_map<std::string, int32_t> names_;
  std::vector<int32_t> order_;      // ids in load order
  std::vector<int32_t> slot_owner_;  // [slot]: adapter id (0: free)
  std::vector<uint64_t> slot_used_;  // [slot]: clock of its last step
  int32_t next_id_ = 1;
  uint64_t clock_ = 0;
  int64_t slot_loads_ = 0;
};

}  // namespace pagellm
