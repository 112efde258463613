// mambacpp: one binary, subcommands. Errors from the library arrive as mambacpp::Error and end the process with a
// message on stderr and exit code 1; bad command lines get CLI11's message and its exit code.
#include <csignal>
#include <iostream>
#include <new>

#include "commands.h"
#include "mambacpp/error.h"

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) a write fails with EFBIG, which the writers report (the previous file kept),
  // instead of the signal ending the process without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"mambacpp: Mamba-1 / Mamba-2 inference"};
  app.require_subcommand(1);
  std::function<void()> run;
  mambacpp::cli::add_generate_command(app, run);
  mambacpp::cli::add_logits_command(app, run);
  mambacpp::cli::add_perplexity_command(app, run);
  mambacpp::cli::add_bench_command(app, run);
  mambacpp::cli::add_serve_command(app, run);
  mambacpp::cli::add_quantize_command(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); every error exits 1, as the library's errors do, whatever code
    // CLI11 gives its error class.
    return app.exit(e) == 0 ? 0 : 1;
  }
  try {
    if (run) run();
  } catch (const mambacpp::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory (an input or option asked for more memory than this machine has)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
