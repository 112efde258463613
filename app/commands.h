// Each subcommand registers its options on the app and, when chosen, sets `run` to the work it does.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace mambacpp::cli {

CLI::App* add_logits_command(CLI::App& app, std::function<void()>& run);
CLI::App* add_generate_command(CLI::App& app, std::function<void()>& run);
CLI::App* add_perplexity_command(CLI::App& app, std::function<void()>& run);
CLI::App* add_bench_command(CLI::App& app, std::function<void()>& run);
CLI::App* add_serve_command(CLI::App& app, std::function<void()>& run);
CLI::App* add_quantize_command(CLI::App& app, std::function<void()>& run);

}  // namespace mambacpp::cli
