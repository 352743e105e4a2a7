#include "lamp/models/flops.h"

#include <c10/util/Exception.h>

#include <vector>

#include "lamp/models/registry.h"
#include "lamp/models/resnet.h"

namespace lamp {
namespace models {
namespace {

int64_t conv(int64_t in, int64_t out, int64_t k, int64_t h, int64_t w) {
  return 2 * in * out * k * k * h * w;
}

int64_t resnet_flops(const std::vector<int64_t>& blocks, bool bottleneck,
                     int64_t in_channels, int64_t h, int64_t w,
                     int64_t classes) {
  int64_t flops = conv(in_channels, 64, 3, h, w); // 3x3 stem, stride 1
  int64_t in = 64;
  const int64_t planes_per_stage[] = {64, 128, 256, 512};
  for (size_t stage = 0; stage < 4; ++stage) {
    const int64_t planes = planes_per_stage[stage];
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      // Same padding: output = ceil(input / stride).
      const int64_t ho = (h + stride - 1) / stride,
                    wo = (w + stride - 1) / stride;
      const int64_t out = bottleneck ? 4 * planes : planes;
      if (bottleneck) {
        flops += conv(in, planes, 1, h, w) + conv(planes, planes, 3, ho, wo) +
                 conv(planes, out, 1, ho, wo);
      } else {
        flops += conv(in, planes, 3, ho, wo) + conv(planes, planes, 3, ho, wo);
      }
      if (stride != 1 || in != out) {
        flops += conv(in, out, 1, ho, wo); // projection shortcut
      }
      in = out;
      h = ho;
      w = wo;
    }
  }
  return flops + 2 * in * classes;
}

} // namespace

int64_t forward_flops(const std::string& model, int64_t in_channels,
                      int64_t height, int64_t width, int64_t num_classes) {
  if (model == "cnn") {
    // conv 5x5 pad 2 at full size, pool 2, conv 5x5 at half size, pool 2.
    return conv(in_channels, 16, 5, height, width) +
           conv(16, 32, 5, height / 2, width / 2) +
           2 * 32 * (height / 4) * (width / 4) * num_classes;
  }
  check_model_name(model, "lamp::models::forward_flops");
  // The depth table the ResNets are built from (resnet_options).
  const auto options = resnet_options(model, num_classes, in_channels);
  return resnet_flops(options.blocks(), options.bottleneck(), in_channels,
                      height, width, num_classes);
}

} // namespace models
} // namespace lamp
