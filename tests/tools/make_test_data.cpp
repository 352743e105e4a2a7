// Writes small datasets in the exact on-disk formats the programs read, for
// their smoke tests:
//   DIR/cifar/data_batch_{1..5}.bin, test_batch.bin  (CIFAR-10 binary)
//   DIR/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz  (IDX, gzip)
//   DIR/mnist-blank/...  the same, every pixel 0 (data that cannot be
//                        normalised)
//   DIR/mnist-other/...  the counts and sizes of DIR/mnist, other images and
//                        labels (another dataset of the same size)
//   DIR/mnist-small-test/... DIR/mnist's training files, test images of
//                        14x14 (test images of another size)
//   DIR/mnist-degenerate/... every image the same and nearly blank, every
//                        label 0 (data the programs warn about)
//   DIR/mnist-10px/...   images of 10x10, training and test (not MNIST's
//                        size: the CNN refuses them, ResNet takes them)
// Each image is a noisy pattern whose brightness depends on its label, so a
// few steps of training have something to learn. No LibTorch: it builds fast.
#include <zlib.h>

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

std::mt19937 rng(12345);

uint8_t pixel(int label) {
  std::uniform_int_distribution<int> noise(-30, 30);
  return static_cast<uint8_t>(
      std::max(0, std::min(255, 20 + 22 * label + noise(rng))));
}

bool write_cifar(const std::string& path, int records) {
  std::ofstream out(path, std::ios::binary);
  for (int r = 0; r < records; ++r) {
    const int label = r % 10;
    out.put(static_cast<char>(label));
    for (int i = 0; i < 3072; ++i) {
      out.put(static_cast<char>(pixel(label)));
    }
  }
  return out.good();
}

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  v.push_back(static_cast<uint8_t>(x >> 24));
  v.push_back(static_cast<uint8_t>(x >> 16));
  v.push_back(static_cast<uint8_t>(x >> 8));
  v.push_back(static_cast<uint8_t>(x));
}

bool write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  if (file == nullptr) {
    return false;
  }
  const int written =
      gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  return gzclose(file) == Z_OK && written == static_cast<int>(bytes.size());
}

// Every image the same, nearly blank (one pixel of 3 in a black image),
// every label 0: data a run can only be warned about.
bool write_degenerate_mnist(const std::string& dir, const std::string& prefix,
                            int count) {
  std::vector<uint8_t> images = {0, 0, 8, 3}, labels = {0, 0, 8, 1};
  put_be32(images, count);
  put_be32(images, 28);
  put_be32(images, 28);
  put_be32(labels, count);
  for (int n = 0; n < count; ++n) {
    labels.push_back(0);
    for (int i = 0; i < 28 * 28; ++i) {
      images.push_back(i == 0 ? 3 : 0);
    }
  }
  return write_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", images) &&
         write_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", labels);
}

bool write_mnist(const std::string& dir, const std::string& prefix, int count,
                 bool blank = false, int side = 28, int label_shift = 0) {
  std::vector<uint8_t> images = {0, 0, 8, 3}, labels = {0, 0, 8, 1};
  put_be32(images, count);
  put_be32(images, side);
  put_be32(images, side);
  put_be32(labels, count);
  for (int n = 0; n < count; ++n) {
    const int label = (n + label_shift) % 10;
    labels.push_back(static_cast<uint8_t>(label));
    for (int i = 0; i < side * side; ++i) {
      images.push_back(blank ? 0 : pixel(label));
    }
  }
  return write_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", images) &&
         write_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", labels);
}

void usage(std::FILE* to, const char* program) {
  std::fprintf(
      to,
      "usage: %s OUTPUT_DIR\nWrites small CIFAR-10 (binary) and MNIST (IDX, gzip) datasets under OUTPUT_DIR/cifar, OUTPUT_DIR/mnist, OUTPUT_DIR/mnist-blank, OUTPUT_DIR/mnist-other, OUTPUT_DIR/mnist-small-test, OUTPUT_DIR/mnist-degenerate and OUTPUT_DIR/mnist-10px.\n",
      program);
}

} // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 ||
                    std::strcmp(argv[1], "-h") == 0)) {
    usage(stdout, argv[0]);
    return 0;
  }
  // A name starting with '-' is a mistyped option, not a folder to create.
  if (argc != 2 || argv[1][0] == '-' || argv[1][0] == '\0') {
    if (argc == 2) {
      std::fprintf(stderr, "%s: '%s' is not an output folder\n", argv[0],
                   argv[1]);
    }
    usage(stderr, argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  const std::string cifar = root + "/cifar", mnist = root + "/mnist",
                    blank = root + "/mnist-blank",
                    other = root + "/mnist-other",
                    small_test = root + "/mnist-small-test",
                    degenerate = root + "/mnist-degenerate",
                    ten = root + "/mnist-10px";
  for (const auto& dir :
       {root, cifar, mnist, blank, other, small_test, degenerate, ten}) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      std::perror(dir.c_str());
      return 1;
    }
  }
  bool ok = true;
  for (int i = 1; i <= 5; ++i) {
    ok = ok &&
         write_cifar(cifar + "/data_batch_" + std::to_string(i) + ".bin", 16);
  }
  ok = ok && write_cifar(cifar + "/test_batch.bin", 20);
  ok =
      ok && write_mnist(mnist, "train", 200) && write_mnist(mnist, "t10k", 100);
  ok = ok && write_mnist(blank, "train", 20, /*blank=*/true) &&
       write_mnist(blank, "t10k", 10, /*blank=*/true);
  ok = ok && write_mnist(other, "train", 200, false, 28, /*label_shift=*/3) &&
       write_mnist(other, "t10k", 100, false, 28, /*label_shift=*/3);
  ok = ok && write_degenerate_mnist(degenerate, "train", 40) &&
       write_degenerate_mnist(degenerate, "t10k", 10);
  ok = ok && write_mnist(small_test, "train", 200) &&
       write_mnist(small_test, "t10k", 100, false, /*side=*/14);
  ok = ok && write_mnist(ten, "train", 40, false, /*side=*/10) &&
       write_mnist(ten, "t10k", 20, false, /*side=*/10);
  if (!ok) {
    std::fprintf(stderr, "make_test_data: could not write the files under %s\n",
                 root.c_str());
    return 1;
  }
  std::printf("test data written to %s\n", root.c_str());
  return 0;
}
