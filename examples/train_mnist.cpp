// Trains a classifier on MNIST-format data (MNIST, Fashion-MNIST) in any of
// lamp's precision modes:
//
//   train_mnist --precision amp-bf16 --epochs 2
//   train_mnist --model resnet18 --precision amp --device cuda
#include <lamp/lamp.h>

#include "common/classifier_program.h"

int main(int argc, char** argv) {
  lamp_examples::ProgramConfig config;
  config.model = "cnn";
  config.models = {"cnn", "resnet18", "resnet50"};
  config.epochs = 2;
  config.batch_size = 128;
  config.lr = 0.05;
  config.data = lamp::data::default_fashion_mnist_directory();
  return lamp_examples::program_main(
      argc, argv, "train_mnist",
      "Train on MNIST-format data (default: Debian's Fashion-MNIST) with lamp",
      config, [&config] {
        TORCH_CHECK(
            !config.data.empty(),
            "no --data directory given and Debian's Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist).");
        lamp_examples::RunSpec spec;
        spec.train = lamp::data::read_mnist(config.data, /*train=*/true);
        spec.test = lamp::data::read_mnist(config.data, /*train=*/false);
        for (const char* part : {"train-images-idx3", "train-labels-idx1",
                                 "t10k-images-idx3", "t10k-labels-idx1"}) {
          for (const char* suffix : {"-ubyte", "-ubyte.gz"}) {
            spec.data_files.push_back(config.data + "/" + part + suffix);
          }
        }
        std::tie(spec.mean, spec.std) = lamp_examples::channel_stats(
            spec.train.inputs, "the training images of '" + config.data + "'");
        const int64_t channels = spec.train.inputs.size(1);
        // The CNN's dense layer fixes MNIST's size; ResNet pools any size.
        const auto height = spec.train.inputs.size(2);
        const auto width = spec.train.inputs.size(3);
        TORCH_CHECK(config.model != "cnn" || (height == 28 && width == 28),
                    "--data ", config.data, " holds images of ", height, "x",
                    width,
                    "; --model cnn takes MNIST's 28x28 only: give --model "
                    "resnet18 (any size), or images of 28x28.");
        spec.make_model = [channels](const std::string& name,
                                     const std::string& fused_bn) {
          return lamp::models::make_model(name, 10, channels, fused_bn != "off",
                                          fused_bn == "conv");
        };
        return spec;
      });
}
