#pragma once

/// \file
/// Image-classification datasets read whole into memory (CIFAR-10's binary
/// version, MNIST / Fashion-MNIST IDX files), and an adapter that serves them
/// to LibTorch's own `torch::data` DataLoader.

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lamp {
namespace data {

/// A whole dataset in memory, on the CPU: `inputs` and their `targets`.
///  - Images (read_cifar10(), read_mnist()): inputs uint8 `[N, C, H, W]`,
///    targets int64 `[N]`, a class per image.
///  - Token sequences (text_windows(), read_text_windows()): inputs `[N, T]`
///    token ids in the narrowest integer type that holds the vocabulary
///    (token_dtype(): uint8 for bytes), targets `[N, T]` the next token of
///    each position, in the same type (or int64).
/// Both as the trainer's task expects (training::Task): a class per example,
/// or a token per position.
struct Dataset {
  /// uint8 [N, C, H, W] pixel values 0-255, or integer token ids [N, T];
  /// on the CPU.
  torch::Tensor inputs;
  /// int64 [N], the class of each example (0-9 for the image readers
  /// here); or integer [N, T], the next token of each position of a
  /// sequence.
  torch::Tensor targets;
  /// Whether int16 `inputs` and `targets` hold unsigned 16-bit ids (a
  /// memory-mapped uint16 token file of a vocabulary above 32,768,
  /// read_token_files()): an id is its value modulo 65,536
  /// (widen_token_ids()). DeviceLoader serves them widened.
  bool unsigned_ids = false;

  /// N, the number of examples (0 when `targets` is undefined).
  int64_t size() const;
  /// Whether the inputs are token sequences ([N, T] integers), not images.
  bool sequences() const;
};

/// The narrowest integer type that holds the token ids 0 .. vocab_size - 1:
/// kByte up to 256, kShort up to 32768, kInt above (LibTorch has no
/// unsigned 16-bit type on every version lamp builds with). A corpus of n
/// tokens then takes n, 2n or 4n bytes instead of int64's 8n. Throws
/// c10::Error unless 1 <= vocab_size <= 2^31 - 1.
torch::Dtype token_dtype(int64_t vocab_size);

/// A short text that tells datasets apart, for checkpoints that must be
/// resumed on the data they were trained on:
/// `"60000 images 1x28x28, labels crc32 1a2b3c4d, images crc32 0badf00d"`,
/// or for token sequences
/// `"9000 sequences of 64 tokens (uint8), targets crc32 ..., tokens crc32 ..."`.
/// The first CRC-32 covers every target (as int64); the second a fixed
/// sample of the inputs, every k-th example from the first with k =
/// ceil(N / 1024), so that it costs a few milliseconds for CIFAR-10 (two
/// datasets that differ only in inputs outside the sample share a
/// fingerprint). Above 2^26 targets (token files of billions of ids) the
/// first covers the sampled examples' targets only, and says so
/// (`"targets sample crc32"`); uint16 ids (Dataset::unsigned_ids) are named
/// so. `dataset` may be on any device; the sample and the targets
/// are copied to the CPU. MNIST and Fashion-MNIST, of the same counts and
/// sizes, get different fingerprints.
///
/// Throws c10::Error when the inputs are neither uint8 [N, C, H, W] nor
/// integer [N, T], or the targets not [N] or [N, T].
std::string fingerprint(const Dataset& dataset);

/// Whether `stored`, a fingerprint() kept in a checkpoint, is that of the
/// dataset whose fingerprint() is `current`: the same text, or, for byte
/// sequences (uint8 tokens), lamp 0.4's form of the same data (`"N images
/// 1x1xT, ..."`: its text windows were stored as images), so that a 0.4
/// checkpoint still resumes.
bool fingerprints_match(const std::string& stored, const std::string& current);

/// Reads CIFAR-10's *binary* version
/// (https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz, extracted so
/// that the `.bin` files lie directly in `directory`).
///
/// `train = true` reads `data_batch_1.bin` ... `data_batch_5.bin` in that
/// order (50,000 images), `train = false` reads `test_batch.bin` (10,000).
/// Each record is 1 label byte (0-9) followed by 3072 pixel bytes: the R, G
/// and B planes, each 32x32 row-major. The result has inputs
/// `[N, 3, 32, 32]` uint8 and targets `[N]` int64.
///
/// Example:
/// \code
///   auto train = lamp::data::read_cifar10("data/cifar-10-batches-bin", true);
///   // train.inputs: [50000, 3, 32, 32] uint8, train.targets: [50000] int64
/// \endcode
///
/// \warning The Python version (`cifar-10-python.tar.gz`: pickled
/// `data_batch_1` without `.bin`, `batches.meta`) is a different format; it
/// is refused with an error that says so.
///
/// Throws c10::Error when a file is missing (naming every file looked for and
/// where to get the archive), empty, not a whole number of 3073-byte records,
/// unreadable, or holds a label above 9, and when the files together are
/// larger than the machine's physical memory (checked before allocating).
Dataset read_cifar10(const std::string& directory, bool train);

/// The files read_cifar10() expects in `directory` (full paths, in reading
/// order), for messages and tools.
std::vector<std::string> cifar10_files(const std::string& directory,
                                       bool train);

/// Reads one IDX file (the MNIST format), plain or gzip-compressed. gzip is
/// recognised by its magic bytes `0x1f 0x8b`, not by the file's name.
///
/// The (decompressed) file is: the magic `0x00 0x00 <type> <ndims>`, then
/// `ndims` big-endian int32 sizes, then exactly the product of the sizes in
/// data bytes. Only type `0x08` (unsigned byte) is supported. Returns a uint8
/// tensor with those sizes.
///
/// Throws c10::Error on a missing or unreadable file, a corrupt or truncated
/// gzip stream, a wrong magic, an unsupported type code, a truncated header or
/// data, trailing bytes beyond what the sizes describe, or sizes (or a
/// compressed file) larger than the machine's physical memory. The header is
/// read and checked first, so a corrupt or sparse file claiming terabytes is
/// refused before anything large is allocated.
torch::Tensor read_idx(const std::string& path);

/// Reads MNIST or Fashion-MNIST from `directory`, which holds
/// `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
/// `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each plain or with a
/// `.gz` suffix (whichever exists; the plain one when both do). Debian's
/// `dataset-fashion-mnist` ships the `.gz` ones in
/// `/usr/share/datasets/fashion-mnist` (see default_fashion_mnist_directory()).
///
/// Returns inputs `[N, 1, H, W]` uint8 (28x28 for MNIST; any HxW is
/// accepted) and targets `[N]` int64, the label bytes as stored (0-9).
///
/// Example:
/// \code
///   auto dir = lamp::data::default_fashion_mnist_directory();
///   auto test = lamp::data::read_mnist(dir, /*train=*/false);
///   // test.inputs: [10000, 1, 28, 28] uint8
/// \endcode
///
/// Throws c10::Error when a file is missing (naming every name looked for),
/// when read_idx() fails, when the images file is not 3-dimensional or the
/// labels file not 1-dimensional, when their counts differ or are zero, or
/// when a label is above 9 (naming the file and the record).
Dataset read_mnist(const std::string& directory, bool train);

/// `/usr/share/datasets/fashion-mnist` (Debian's `dataset-fashion-mnist`) if
/// that directory exists, else "".
std::string default_fashion_mnist_directory();

/// Serves a Dataset to LibTorch's `torch::data` DataLoader: example `i` is
/// `{image, label}` with `image` float `[C, H, W]` equal to
/// `(inputs[i] / 255 - mean[c]) / std[c]` per channel `c`, and `label` the
/// int64 scalar `targets[i]`. The uint8 images stay as they are in memory;
/// each get() converts one image.
///
/// Example:
/// \code
///   lamp::data::TensorImageDataset train(
///       lamp::data::read_mnist(dir, true), {0.2860}, {0.3530});
///   auto loader = torch::data::make_data_loader(
///       train.map(torch::data::transforms::Stack<>()),
///       torch::data::DataLoaderOptions(128));
///   for (auto& batch : *loader) { /* batch.data: [128, 1, 28, 28] float */ }
/// \endcode
class TensorImageDataset
    : public torch::data::datasets::Dataset<TensorImageDataset> {
 public:
  /// Checks that `data` is uint8 `[N, C, H, W]` with int64 targets `[N]` on
  /// the CPU, and that `mean` and `std` hold C values each (`std` positive).
  TensorImageDataset(lamp::data::Dataset data, std::vector<double> mean,
                     std::vector<double> std);

  /// The normalised image and the label of example `index` (< N).
  torch::data::Example<> get(size_t index) override;

  /// N.
  c10::optional<size_t> size() const override;

  /// The uint8 images and int64 targets as given.
  const lamp::data::Dataset& data() const { return data_; }

 private:
  lamp::data::Dataset data_;
  torch::Tensor mean_; // float [C, 1, 1]
  torch::Tensor std_;  // float [C, 1, 1]
};

} // namespace data
} // namespace lamp
