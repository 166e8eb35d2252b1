// `pagellm info FILE`: GGUF metadata and tensor table (like gguf-dump).
// `pagellm info --devices`: the backends this binary can run on.
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "backend/cpu/quants.h"
#include "backend/registry.h"
#include "cli/commands.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "format/gguf.h"

namespace pagellm::cli {

Command register_info(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "Print a GGUF file's metadata and tensors, and this CPU's features");
  auto path = std::make_shared<std::string>();
  auto show_tensors = std::make_shared<bool>(false);
  auto show_devices = std::make_shared<bool>(false);
  sub->add_option("file", *path, "GGUF file");
  sub->add_flag("--tensors", *show_tensors, "List every tensor");
  sub->add_flag("--devices", *show_devices, "List the backends: built in, and plugins found (each one tried)");
  return {sub, [path, show_tensors, show_devices]() {
            const auto& cpu = cpu_features();
            fmt::print("cpu: {}\nkernels: {}\n", cpu.describe(), cpu::describe_kernels(cpu.best()));
            if (*show_devices) {
              namespace fs = std::filesystem;
              for (const std::string& dir : plugin_search_dirs()) {
                std::error_code ec;
                for (const auto& e : fs::directory_iterator(dir, ec)) {
                  const std::string name = e.path().filename().string();
                  if (name.rfind("libpagellm_backend_", 0) != 0) continue;
                  try {
                    load_backend_plugin(e.path().string());
                  } catch (const std::exception& err) {
                    fmt::print("plugin {}: {}\n", e.path().string(), err.what());
                  }
                }
              }
              for (const BackendEntry& b : registered_backends()) {
                std::string state;
                try {
                  state = create_backend(b.kind)->describe();
                } catch (const std::exception& err) {
                  state = std::string("unavailable: ") + err.what();
                }
                int count = 0;
                try {
                  count = b.device_count ? b.device_count() : 0;
                } catch (const std::exception&) {
                }
                fmt::print("device {} ({}; {}; {} device{}): {}\n", b.kind, b.origin, b.description, count,
                           count == 1 ? "" : "s", state);
              }
              if (path->empty()) return 0;
            }
            if (path->empty()) fail("info needs a GGUF file (or --devices)");
            auto f = GGUFFile::open(*path);
            fmt::print("{}: GGUF v{}, {} metadata keys, {} tensors\n", f->path(), f->version(), f->metadata().size(),
                       f->tensors().size());
            for (const auto& [k, v] : f->metadata()) fmt::print("  {} = {}\n", k, v.to_string());
            if (*show_tensors)
              for (const auto& t : f->tensors())
                fmt::print("  {:<40} {:<6} {}\n", t.name, dtype_name(t.type), t.shape_string());
            return 0;
          }};
}

}  // namespace pagellm::cli
