// Trains a CIFAR-style ResNet on CIFAR-10 (binary version) in any of lamp's
// precision modes:
//
//   train_cifar10 --model resnet50 --fp16
//   train_cifar10 --model resnet18 --precision amp --channels-last
//   --cudnn-benchmark
#include <lamp/lamp.h>

#include "common/classifier_program.h"

int main(int argc, char** argv) {
  lamp_examples::ProgramConfig config;
  config.model = "resnet18";
  config.models = lamp::models::resnet_names();
  config.epochs = 30;
  config.batch_size = lamp::cuda_available() ? 512 : 128;
  config.lr = 0.2;
  config.data = "data/cifar-10-batches-bin";
  return lamp_examples::program_main(
      argc, argv, "train_cifar10",
      "Train a ResNet on CIFAR-10 with lamp (get the data: scripts/get_cifar10.sh)",
      config, [&config] {
        lamp_examples::RunSpec spec;
        spec.train = lamp::data::read_cifar10(config.data, /*train=*/true);
        spec.test = lamp::data::read_cifar10(config.data, /*train=*/false);
        for (const bool train : {true, false}) {
          for (auto& file : lamp::data::cifar10_files(config.data, train)) {
            spec.data_files.push_back(std::move(file));
          }
        }
        // The usual CIFAR-10 statistics and augmentation (4-pixel crop, flip).
        spec.mean = {0.4914, 0.4822, 0.4465};
        spec.std = {0.2470, 0.2435, 0.2616};
        spec.crop_padding = 4;
        spec.horizontal_flip = true;
        spec.make_model = [](const std::string& name,
                             const std::string& fused_bn) {
          return lamp::models::make_model(name, 10, 3, fused_bn != "off",
                                          fused_bn == "conv");
        };
        return spec;
      });
}
