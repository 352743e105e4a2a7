// lamp 0.1's header paths were forwarding headers in 0.2 and are gone in 0.3
// (with the lamp::training:: names of the checkpoint files), lamp 0.2's
// lamp/models/relu_max_pool.h was one in 0.4 and is gone in 0.5; the
// version header and the library agree. (The folders' layering is checked by
// scripts/check_layers.py, ctest layout.layers; every public header compiling
// on its own by the lamp_self_contained_headers target, tests/packaging.)
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "lamp/version.h"

namespace {

// The old paths the include path still finds.
std::vector<std::string> old_paths_found() {
  std::vector<std::string> found;
#if __has_include("lamp/autocast.h")
  found.push_back("lamp/autocast.h");
#endif
#if __has_include("lamp/backends.h")
  found.push_back("lamp/backends.h");
#endif
#if __has_include("lamp/grad_scaler.h")
  found.push_back("lamp/grad_scaler.h");
#endif
#if __has_include("lamp/half.h")
  found.push_back("lamp/half.h");
#endif
#if __has_include("lamp/master_weights.h")
  found.push_back("lamp/master_weights.h");
#endif
#if __has_include("lamp/ops.h")
  found.push_back("lamp/ops.h");
#endif
#if __has_include("lamp/precision.h")
  found.push_back("lamp/precision.h");
#endif
#if __has_include("lamp/report.h")
  found.push_back("lamp/report.h");
#endif
#if __has_include("lamp/train_step.h")
  found.push_back("lamp/train_step.h");
#endif
#if __has_include("lamp/training/checkpoint_file.h")
  found.push_back("lamp/training/checkpoint_file.h");
#endif
#if __has_include("lamp/models/relu_max_pool.h")
  found.push_back("lamp/models/relu_max_pool.h"); // lamp 0.4's forwarding
#endif
  return found;
}

} // namespace

TEST(Layout, LampZeroOneHeaderPathsAreGone) {
  const auto found = old_paths_found();
  std::string list;
  for (const auto& path : found) {
    list += " " + path;
  }
  EXPECT_TRUE(found.empty()) << "still found:" << list;
}

// The headers that stay at the top of include/lamp.
#if !__has_include("lamp/lamp.h") ||                       \
                   !__has_include("lamp/distributed.h") || \
                                  !__has_include("lamp/version.h")
#error "lamp/lamp.h, lamp/distributed.h and lamp/version.h must stay"
#endif

TEST(Version, LibraryIsTheVersionOfTheHeaders) {
  // A program compiled with one install's headers and linked with another's
  // library would see two versions here.
  EXPECT_STREQ(lamp::version(), LAMP_VERSION);
}

TEST(Version, NumberAgreesWithTheParts) {
  // "MAJOR.MINOR.PATCH" read back from the string, and each part below 100
  // so that the number MAJOR * 10000 + MINOR * 100 + PATCH is unambiguous.
  int major = -1;
  int minor = -1;
  int patch = -1;
  char rest = 0;
  ASSERT_EQ(
      std::sscanf(LAMP_VERSION, "%d.%d.%d%c", &major, &minor, &patch, &rest), 3)
      << LAMP_VERSION;
  EXPECT_EQ(major, LAMP_VERSION_MAJOR);
  EXPECT_EQ(minor, LAMP_VERSION_MINOR);
  EXPECT_EQ(patch, LAMP_VERSION_PATCH);
  EXPECT_LT(LAMP_VERSION_MINOR, 100);
  EXPECT_LT(LAMP_VERSION_PATCH, 100);
  EXPECT_EQ(LAMP_VERSION_NUMBER, major * 10000 + minor * 100 + patch);
}
