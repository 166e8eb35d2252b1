#include "engine/lora_registry.h"

#include <algorithm>

#include "core/error.h"

namespace pagellm {

void LoraConfig::validate() const {
  PAGELLM_CHECK(max_loras >= 1 && max_loras <= 256, "--max-loras must be in [1, 256], got {}", max_loras);
  PAGELLM_CHECK(max_lora_rank >= 1 && max_lora_rank <= 512, "--max-lora-rank must be in [1, 512], got {}",
                max_lora_rank);
  PAGELLM_CHECK(max_cpu_loras == 0 || max_cpu_loras >= max_loras,
                "--max-cpu-loras ({}) must be at least --max-loras ({})", max_cpu_loras, max_loras);
  PAGELLM_CHECK(enabled || modules.empty(), "--lora-modules needs --enable-lora");
}

LoraLease::~LoraLease() { registry_.release(id_); }

LoraRegistry::LoraRegistry(Model& model, const LoraConfig& config) : model_(model), config_(config) {
  config_.validate();
  if (config_.max_cpu_loras == 0) config_.max_cpu_loras = config_.max_loras;
  slot_owner_.assign(static_cast<size_t>(config_.max_loras) + 1, 0);
  slot_used_.assign(slot_owner_.size(), 0);
  for (const LoraModule& m : config_.modules) load(m.name, m.path);
}

void LoraRegistry::load(const std::string& name, const std::string& path) {
  if (name.empty()) throw InvalidRequest("a LoRA adapter needs a name", "lora_name");
  if (names_.count(name)) throw InvalidRequest(fmt::format("LoRA adapter '{}' is already loaded", name), "lora_name");
  auto adapter = std::make_shared<const LoraAdapter>(read_lora_adapter(path, model_, config_.max_lora_rank));
  const int32_t id = next_id_++;
  Entry& e = entries_[id];
  e.name = name;
  e.path = path;
  e.rank = adapter->rank;
  e.host = std::move(adapter);
  e.last_used = ++clock_;
  names_[name] = id;
  order_.push_back(id);
  trim_host();
}

bool LoraRegistry::unload(const std::string& name) {
  auto it = names_.find(name);
  if (it == names_.end()) return false;
  const int32_t id = it->second;
  names_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));
  Entry& e = entries_.at(id);
  e.unloaded = true;
  if (e.refs == 0) forget(id);
  return true;
}

std::unique_ptr<LoraLease> LoraRegistry::acquire(const std::string& name) {
  auto it = names_.find(name);
  if (it == names_.end()) throw InvalidRequest(fmt::format("The model `{}` does not exist.", name), "model");
  Entry& e = entries_.at(it->second);
  // Dropped while unused: read again (the file was checked when it was loaded).
  if (!e.host) e.host = std::make_shared<const LoraAdapter>(read_lora_adapter(e.path, model_, config_.max_lora_rank));
  ++e.refs;
  e.last_used = ++clock_;
  trim_host();
  return std::make_unique<LoraLease>(*this, it->second);
}

void LoraRegistry::release(int32_t id) {
  Entry& e = entries_.at(id);
  --e.refs;
  if (e.refs == 0 && e.unloaded) forget(id);
  else trim_host();
}

void LoraRegistry::forget(int32_t id) {
  const Entry& e = entries_.at(id);
  if (e.slot > 0) slot_owner_[static_cast<size_t>(e.slot)] = 0;
  entries_.erase(id);
}

// Host copies of adapters no request holds, beyond max_cpu_loras, least
// recently used first (those held stay: a step may need them).
void LoraRegistry::trim_host() {
  for (;;) {
    int32_t held = 0;
    Entry* lru = nullptr;
    for (auto& [id, e] : entries_) {
      if (!e.host) continue;
      ++held;
      if (e.refs == 0 && (!lru || e.last_used < lru->last_used)) lru = &e;
    }
    if (held <= config_.max_cpu_loras || !lru) return;
    lru->host.reset();
  }
}

void LoraRegistry::assign_slots(StepPlan& plan) {
  ++clock_;
  for (ScheduledSeq& s : plan.seqs) s.lora_slot = s.seq->lora_id == 0 ? 0 : slot_for(s.seq->lora_id);
}

int32_t LoraRegistry::slot_for(int32_t id) {
  Entry& e = entries_.at(id);
  if (e.slot == 0) {
    // A free slot, else the one used longest ago by a step before this one.
    int32_t best = 0;
    for (int32_t s = 1; s <= config_.max_loras; ++s) {
      if (slot_owner_[s] == 0) {
        best = s;
        break;
      }
      if (slot_used_[s] != clock_ && (best == 0 || slot_used_[s] < slot_used_[best])) best = s;
    }
    PAGELLM_CHECK(best > 0, "a step with more than --max-loras {} adapters", config_.max_loras);
    if (const int32_t owner = slot_owner_[best]; owner != 0) entries_.at(owner).slot = 0;
    PAGELLM_CHECK(e.host, "LoRA adapter '{}' is not in host memory while a request uses it", e.name);
    model_.set_lora_slot(best, e.host.get());
    slot_owner_[best] = id;
    e.slot = best;
    ++slot_loads_;
  }
  slot_used_[e.slot] = clock_;
  e.last_used = clock_;
  return e.slot;
}

std::vector<LoraInfo> LoraRegistry::list() const {
  std::vector<LoraInfo> out;
  for (int32_t id : order_) {
    const Entry& e = entries_.at(id);
    out.push_back({e.name, e.path, id, e.rank, e.refs, e.slot});
  }
  return out;
}

std::string LoraRegistry::name_of(int32_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? std::string() : it->second.name;
}

std::string LoraRegistry::path_of(int32_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? std::string() : it->second.path;
}

}  // namespace pagellm
