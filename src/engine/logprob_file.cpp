// perplexity --save-logprobs / --kl-base files (include/mambacpp/perplexity.h).
#include <cstring>
#include <string>

#include "core/atomic_file.h"
#include "mambacpp/error.h"
#include "mambacpp/perplexity.h"

namespace mambacpp {

namespace {

struct Header {
  char magic[8] = {'M', 'C', 'P', 'P', 'L', 'P', '1', '\0'};
  int64_t vocab = 0, tokens = 0, context = 0;
};

uint64_t row_offset(int64_t pos, int64_t vocab) {
  return sizeof(Header) + static_cast<uint64_t>(pos) * static_cast<uint64_t>(vocab) * sizeof(float);
}

}  // namespace

LogprobWriter::LogprobWriter(const std::string& path, const LogprobFileShape& shape)
    : file_(std::make_unique<AtomicFile>(path, "log-probabilities file")),
      shape_(shape),
      row_(static_cast<size_t>(shape.vocab)) {
  Header h;
  h.vocab = shape.vocab;
  h.tokens = shape.tokens;
  h.context = shape.context;
  file_->write(&h, sizeof h);
}

LogprobWriter::~LogprobWriter() = default;

void LogprobWriter::write_row(int64_t pos, std::span<const double> logprobs) {
  if (pos < 0 || pos >= shape_.tokens || static_cast<int64_t>(logprobs.size()) != shape_.vocab)
    fail("log-probabilities file '", file_->path(), "': row ", pos, " of ", logprobs.size(), " values, expected a row < ",
         shape_.tokens, " of ", shape_.vocab);
  for (size_t i = 0; i < logprobs.size(); ++i) row_[i] = static_cast<float>(logprobs[i]);
  file_->write_at(row_offset(pos, shape_.vocab), row_.data(), row_.size() * sizeof(float));
}

void LogprobWriter::commit() {
  // The last element written (zero where that row was not scored) gives the file its whole length.
  const float last = 0.0f;
  if (shape_.tokens > 0 && shape_.vocab > 0) {
    file_->write_at(row_offset(shape_.tokens, shape_.vocab) - sizeof(float), &last, sizeof last);
  }
  file_->commit();
}

LogprobReader::LogprobReader(const std::string& path, const LogprobFileShape& expected)
    : path_(path), shape_(expected), row_(static_cast<size_t>(expected.vocab)) {
  in_.open(path, std::ios::binary);
  if (!in_) fail("perplexity: cannot open --kl-base '", path, "'");
  Header h, want;
  in_.read(reinterpret_cast<char*>(&h), sizeof h);
  if (!in_ || std::memcmp(h.magic, want.magic, sizeof h.magic) != 0)
    fail("perplexity: '", path, "' is not a --save-logprobs file");
  if (h.vocab != expected.vocab || h.tokens != expected.tokens || h.context != expected.context)
    fail("perplexity: --kl-base '", path, "' holds vocab ", h.vocab, ", ", h.tokens, " tokens, context ", h.context,
         "; this run has vocab ", expected.vocab, ", ", expected.tokens, " tokens, context ", expected.context,
         " (the same text and --context are needed)");
}

std::span<const float> LogprobReader::row(int64_t pos) {
  in_.seekg(static_cast<std::streamoff>(row_offset(pos, shape_.vocab)));
  in_.read(reinterpret_cast<char*>(row_.data()), static_cast<std::streamsize>(row_.size() * sizeof(float)));
  if (!in_) fail("perplexity: --kl-base '", path_, "' ends before position ", pos);
  return row_;
}

}  // namespace mambacpp
