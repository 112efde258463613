// Pre-tokenizer steps (see pre_tokenizer.h).
#include "tokenizer/pre_tokenizer.h"

namespace mambacpp::tok {

void PreTokenizer::split(Piece piece, std::vector<Piece>& out) const {
  if (piece.text.empty()) return;
  if (steps_.empty()) {
    out.push_back(std::move(piece));
    return;
  }
  std::vector<Piece> pieces;
  pieces.push_back(std::move(piece));
  for (const PreTokenizerStep& step : steps_) apply(step, pieces);
  for (Piece& p : pieces) {
    if (!p.text.empty()) out.push_back(std::move(p));
  }
}

void PreTokenizer::apply(const PreTokenizerStep& step, std::vector<Piece>& pieces) const {
  std::vector<Piece> next;
  next.reserve(pieces.size());
  std::vector<std::pair<size_t, size_t>> ranges;
  // Cuts each piece into ranges; only the first range of a piece that is at the start stays at the start.
  auto cut = [&](const Piece& p, std::string_view text) {
    for (auto [b, e] : ranges) next.push_back({std::string(text.substr(b, e - b)), p.at_start && b == 0});
  };
  for (Piece& p : pieces) {
    ranges.clear();
    switch (step.kind) {
      case PreTokenizerStep::Split:
        split_by(p.text, *step.pattern, step.behavior, step.invert, ranges);
        cut(p, p.text);
        break;
      case PreTokenizerStep::ByteLevel: {
        std::vector<std::string_view> words;
        std::string storage;
        step.byte_level_splitter->split(p.text, words, storage);
        // A prepended space is new text: the first word still starts where the piece did.
        for (size_t k = 0; k < words.size(); ++k) next.push_back({bytes_to_alphabet(words[k]), p.at_start && k == 0});
        break;
      }
      case PreTokenizerStep::Metaspace: {
        std::string text;
        text.reserve(p.text.size() + step.replacement.size());
        for (char c : p.text) {
          if (c == ' ') {
            text += step.replacement;
          } else {
            text.push_back(c);
          }
        }
        bool prepend =
            step.prepend == PreTokenizerStep::Always || (step.prepend == PreTokenizerStep::First && p.at_start);
        if (prepend && text.compare(0, step.replacement.size(), step.replacement) != 0) text = step.replacement + text;
        if (!step.metaspace_split) {
          next.push_back({std::move(text), p.at_start});
          break;
        }
        split_by(text, *step.pattern, SplitBehavior::MergedWithNext, false, ranges);
        cut(p, text);
        break;
      }
    }
  }
  pieces = std::move(next);
}

}  // namespace mambacpp::tok
