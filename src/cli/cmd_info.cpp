// `pagellm info FILE`: GGUF metadata and tensor table (like gguf-dump).
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "core/cpu_features.h"
#include "model/gguf.h"

namespace pagellm::cli {

Command register_info(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "Print a GGUF file's metadata and tensors, and this CPU's features");
  auto path = std::make_shared<std::string>();
  auto show_tensors = std::make_shared<bool>(false);
  sub->add_option("file", *path, "GGUF file")->required();
  sub->add_flag("--tensors", *show_tensors, "List every tensor");
  return {sub, [path, show_tensors]() {
            const auto& cpu = cpu_features();
            fmt::print("cpu: {} (kernels: {})\n", cpu.describe(), isa_name(cpu.best()));
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
