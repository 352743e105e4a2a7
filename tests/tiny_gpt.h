#pragma once

// The GPT the fused ops' tests train: 2 blocks of width 16 over 30 token
// ids, context 8, no dropout (so that two runs can agree to the bit).
#include "lamp/models/gpt.h"

namespace lamp_test {

inline lamp::models::GPTOptions tiny_gpt() {
  return lamp::models::GPTOptions()
      .layers(2)
      .heads(2)
      .width(16)
      .context(8)
      .vocab_size(30)
      .dropout(0);
}

} // namespace lamp_test
