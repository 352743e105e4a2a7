// lamp 0.1's header paths, kept as forwarding headers for one release: each
// must still compile on its own and name the very same entities as the new
// path. (The folders' layering is checked by scripts/check_layers.py, ctest
// layout.layers.)
#include "lamp/autocast.h"
#include "lamp/backends.h"
#include "lamp/grad_scaler.h"
#include "lamp/half.h"
#include "lamp/master_weights.h"
#include "lamp/ops.h"
#include "lamp/precision.h"
#include "lamp/report.h"
#include "lamp/train_step.h"
#include "lamp/training/checkpoint_file.h"

#include <gtest/gtest.h>

#include <type_traits>

#include "lamp/amp/autocast.h"
#include "lamp/amp/train_step.h"
#include "lamp/models/relu_max_pool.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/checkpoint_file.h"

TEST(Layout, ForwardingHeadersNameTheMovedEntities) {
  // One entity per forwarding header, reached through the old path only by
  // the include above; the same address or type as through the new one.
  EXPECT_TRUE((std::is_same<lamp::TrainStep, ::lamp::TrainStep>::value));
  EXPECT_EQ(&lamp::parse_precision, &::lamp::parse_precision);
  EXPECT_EQ(&lamp::cuda_available, &::lamp::cuda_available);
  // lamp::training::... names of the checkpoint files (now namespace lamp).
  EXPECT_EQ(&lamp::training::save_pickle, &lamp::save_pickle);
  EXPECT_EQ(&lamp::training::load_pickle, &lamp::load_pickle);
  EXPECT_EQ(&lamp::training::write_file_atomically,
            &lamp::write_file_atomically);
  EXPECT_EQ(&lamp::training::save_checked_archive, &lamp::save_checked_archive);
  EXPECT_EQ(&lamp::training::load_checked_archive, &lamp::load_checked_archive);
  EXPECT_EQ(&lamp::training::check_checkpoint_path,
            &lamp::check_checkpoint_path);
  EXPECT_EQ(&lamp::training::check_writable_path, &lamp::check_writable_path);
  EXPECT_EQ(&lamp::training::crc32, &lamp::crc32);
  EXPECT_TRUE((std::is_same<lamp::training::CheckpointLock,
                            lamp::CheckpointLock>::value));
}
