#include "model/pieces.h"

#include <algorithm>

namespace mambacpp {

bool PieceIterator::next(Piece& piece) {
  if (seq_ >= seqs_.size()) return false;
  piece = Piece{};
  int64_t used = 0;
  while (seq_ < seqs_.size() && used < cap_) {
    const int64_t take = std::min(seqs_[seq_].length() - pos_, cap_ - used);
    piece.batch.seqs.push_back({used, take, seqs_[seq_].slot});
    piece.origin.emplace_back(seq_, pos_);
    used += take;
    pos_ += take;
    if (pos_ == seqs_[seq_].length()) {
      ++seq_;
      pos_ = 0;
    }
  }
  piece.batch.total_tokens = used;
  return true;
}

}  // namespace mambacpp
