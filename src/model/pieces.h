// Packs a forward's sequences into pieces of at most `cap` tokens, in order; a sequence that does not fit continues
// in the next piece from the state the previous one left in its slot, so memory does not grow with L.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "mambacpp/model.h"

namespace mambacpp {

struct Piece {
  BatchLayout batch;
  std::vector<std::pair<size_t, int64_t>> origin;  // per span of batch.seqs: the sequence's index, its first position
  // Whether span k ends its sequence (its last row is the sequence's last position).
  bool ends_sequence(size_t k, std::span<const Sequence> seqs) const {
    return origin[k].second + batch.seqs[k].len == seqs[origin[k].first].length();
  }
};

class PieceIterator {
 public:
  PieceIterator(std::span<const Sequence> seqs, int64_t cap) : seqs_(seqs), cap_(cap) {}
  // The next piece (host layout only: the caller prepares it on the backend); false once every token is packed.
  bool next(Piece& piece);

 private:
  std::span<const Sequence> seqs_;
  int64_t cap_;
  size_t seq_ = 0;  // next sequence
  int64_t pos_ = 0;  // next position within it
};

}  // namespace mambacpp
