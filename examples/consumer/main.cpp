// Loads a model directory, runs a few tokens, prints the argmax of the last logits.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <mambacpp/model.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer MODEL_DIR\n");
    return 2;
  }
  mambacpp::LoadOptions options;
  options.device = mambacpp::DeviceChoice::CPU;
  auto model = mambacpp::Model::load(argv[1], options);
  auto state = model->create_state(1);
  std::vector<int32_t> ids = {1, 2, 3};
  mambacpp::Sequence seq = mambacpp::Sequence::tokens(ids);
  auto out = model->forward(*state, {&seq, 1}, mambacpp::Output::LastLogits);
  auto best = std::max_element(out.values.begin(), out.values.end()) - out.values.begin();
  std::printf("next token: %ld (of %ld)\n", static_cast<long>(best), static_cast<long>(out.cols));
  return 0;
}
