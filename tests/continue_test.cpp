// Continuing a finished run with more epochs, starting a new run from a
// checkpoint's weights (fine-tuning), and exporting any module tree as
// Python's state_dict.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "custom_tree.h"
#include "lamp/amp/master_weights.h"
#include "lamp/models/state_dict.h"
#include "lamp/platform/checkpoint_file.h"
#include "lamp/training/checkpoint_weights.h"
#include "lamp/training/schedule.h"
#include "lamp/training/trainer.h"
#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp::training::RunHistoryEntry;
using lamp::training::Schedule;
using lamp::training::Trainer;
using lamp::training::TrainerOptions;
using lamp_test::CustomTree;
using lamp_test::error_of;
using lamp_test::kCustomTreeKeys;
using lamp_test::make_run;
using lamp_test::temp_path;

// `error` holds `part` (with the whole message on failure).
void expect_contains(const std::string& error, const std::string& part) {
  EXPECT_NE(error.find(part), std::string::npos)
      << "'" << part << "' not in: " << error;
}

void expect_entry(const RunHistoryEntry& entry, const std::string& kind,
                  int64_t at_epoch, int64_t previous_epochs, int64_t epochs,
                  const std::string& source) {
  EXPECT_EQ(entry.kind, kind);
  EXPECT_EQ(entry.at_epoch, at_epoch);
  EXPECT_EQ(entry.previous_epochs, previous_epochs);
  EXPECT_EQ(entry.epochs, epochs);
  EXPECT_EQ(entry.source, source);
}

// A model's FP32 weights by name: the master values where it has them.
c10::Dict<std::string, torch::Tensor> weights_of(Trainer& trainer,
                                                 const torch::nn::Module& m) {
  return lamp::models::python_state_dict(
      m, lamp::models::StateDictOptions().master_weights(
             trainer.train_step().master_weights()));
}

TEST(Trainer, ConstantRunContinuesWithMoreEpochsAndRecordsIt) {
  const auto checkpoint = temp_path("continue.pt");
  const auto constant = TrainerOptions().schedule(Schedule::kConstant);
  make_run(lamp::Precision::kFP32,
           TrainerOptions(constant).epochs(1).checkpoint(checkpoint))
      ->trainer->fit();
  auto continued =
      make_run(lamp::Precision::kFP32, TrainerOptions(constant)
                                           .epochs(2)
                                           .resume(checkpoint)
                                           .checkpoint(checkpoint));
  EXPECT_EQ(continued->trainer->start_epoch(), 1);
  ASSERT_EQ(continued->trainer->history().size(), 1u);
  expect_entry(continued->trainer->history()[0], "continued", 1, 1, 2, "");
  const auto stats = continued->trainer->fit();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].epoch, 2);
  // A constant schedule is the same curve at any length, and an epoch's
  // data depends on (seed, epoch) alone: 1 + 1 epochs are 2 straight.
  const auto straight =
      make_run(lamp::Precision::kFP32, TrainerOptions(constant).epochs(2))
          ->trainer->fit();
  EXPECT_EQ(stats[0].train_loss, straight[1].train_loss);
  EXPECT_EQ(stats[0].test_loss, straight[1].test_loss);
  // The checkpoint keeps the entry; resuming it again adds none, and a
  // second continuation adds its own.
  auto again = make_run(lamp::Precision::kFP32,
                        TrainerOptions(constant).epochs(2).resume(checkpoint));
  EXPECT_EQ(again->trainer->start_epoch(), 2);
  ASSERT_EQ(again->trainer->history().size(), 1u);
  expect_entry(again->trainer->history()[0], "continued", 1, 1, 2, "");
  auto longer = make_run(lamp::Precision::kFP32,
                         TrainerOptions(constant).epochs(5).resume(checkpoint));
  ASSERT_EQ(longer->trainer->history().size(), 2u);
  expect_entry(longer->trainer->history()[1], "continued", 2, 2, 5, "");
  std::remove(checkpoint.c_str());
}

TEST(Trainer, SchedulesThatDependOnTheLengthRefuseMoreEpochs) {
  EXPECT_FALSE(lamp::training::depends_on_length(Schedule::kConstant));
  for (const auto schedule : {Schedule::kOneCycle, Schedule::kCosine}) {
    SCOPED_TRACE(lamp::training::to_string(schedule));
    EXPECT_TRUE(lamp::training::depends_on_length(schedule));
    const auto checkpoint = temp_path("no_continue.pt");
    const auto options = TrainerOptions().schedule(schedule);
    make_run(lamp::Precision::kFP32,
             TrainerOptions(options).epochs(1).checkpoint(checkpoint))
        ->trainer->fit();
    const auto error = error_of([&] {
      make_run(lamp::Precision::kFP32,
               TrainerOptions(options).epochs(3).resume(checkpoint));
    });
    expect_contains(error, "was trained for 1 epochs with --schedule " +
                               lamp::training::to_string(schedule) +
                               ", whose learning rates depend on the run's "
                               "length");
    expect_contains(error, "the learning rate would jump");
    expect_contains(error, "Only a --schedule constant run continues");
    expect_contains(error, "start a new run with --init-from " + checkpoint);
    expect_contains(error, "or resume with --epochs 1.");
    std::remove(checkpoint.c_str());
  }
}

TEST(Trainer, ContinuingStillRefusesFewerEpochsOrAnotherSchedule) {
  const auto checkpoint = temp_path("constant_cut.pt");
  const auto constant = TrainerOptions().schedule(Schedule::kConstant);
  // 6 batches per epoch: the first epoch's checkpoint of a 2-epoch run.
  make_run(
      lamp::Precision::kFP32,
      TrainerOptions(constant).epochs(2).max_steps(6).checkpoint(checkpoint))
      ->trainer->fit();
  expect_contains(error_of([&] {
                    make_run(
                        lamp::Precision::kFP32,
                        TrainerOptions(constant).epochs(1).resume(checkpoint));
                  }),
                  "resume with --epochs 2");
  expect_contains(error_of([&] {
                    make_run(lamp::Precision::kFP32,
                             TrainerOptions()
                                 .schedule(Schedule::kCosine)
                                 .epochs(3)
                                 .resume(checkpoint));
                  }),
                  "resume with --schedule constant");
  // More epochs before the run finished: the same continuation.
  auto continued =
      make_run(lamp::Precision::kFP32,
               TrainerOptions(constant).epochs(3).resume(checkpoint));
  EXPECT_EQ(continued->trainer->start_epoch(), 1);
  ASSERT_EQ(continued->trainer->history().size(), 1u);
  expect_entry(continued->trainer->history()[0], "continued", 1, 2, 3, "");
  std::remove(checkpoint.c_str());
}

// A BF16 run's weights start FP32 and BF16 runs at their FP32 master values,
// with a fresh optimizer, at epoch 0, with another lr, schedule and epochs.
TEST(Trainer, InitFromStartsANewRunFromTheMasterWeights) {
  const auto checkpoint = temp_path("init_from_source.pt");
  auto source =
      make_run(lamp::Precision::kBF16, TrainerOptions()
                                           .epochs(1)
                                           .schedule(Schedule::kOneCycle)
                                           .checkpoint(checkpoint));
  source->trainer->fit();
  const auto source_weights = weights_of(*source->trainer, *source->model);
  // The masters hold more than BF16 does: a rounded load would differ.
  bool any_not_bf16 = false;
  for (const auto& item : source_weights) {
    const auto& value = item.value();
    any_not_bf16 = any_not_bf16 ||
                   (value.is_floating_point() &&
                    !value.to(torch::kBFloat16).to(torch::kFloat).equal(value));
  }
  ASSERT_TRUE(any_not_bf16);
  EXPECT_FALSE(source->trainer->train_step().optimizer().state().empty());

  for (const auto precision : {lamp::Precision::kFP32, lamp::Precision::kBF16,
                               lamp::Precision::kAMPBF16}) {
    SCOPED_TRACE(lamp::to_string(precision));
    auto run = make_run(precision,
                        TrainerOptions()
                            .epochs(3)
                            .schedule(Schedule::kConstant)
                            .max_steps(2)
                            .init_from(checkpoint),
                        /*lr=*/0.01);
    auto& trainer = *run->trainer;
    EXPECT_EQ(trainer.start_epoch(), 0);
    EXPECT_TRUE(trainer.train_step().optimizer().state().empty());
    const auto loaded = weights_of(trainer, *run->model);
    ASSERT_EQ(loaded.size(), source_weights.size());
    for (const auto& item : source_weights) {
      EXPECT_TRUE(loaded.at(item.key()).equal(item.value())) << item.key();
    }
    ASSERT_EQ(trainer.history().size(), 1u);
    expect_entry(trainer.history()[0], "init_from", 0, 1, 3, checkpoint);
    const auto stats = trainer.fit();
    ASSERT_EQ(stats.size(), 1u);
    EXPECT_EQ(stats[0].epoch, 1);
    EXPECT_EQ(stats[0].lr, 0.01);
  }
  // Continuing and starting from weights exclude each other.
  expect_contains(error_of([&] {
                    make_run(lamp::Precision::kFP32,
                             TrainerOptions()
                                 .epochs(1)
                                 .resume(checkpoint)
                                 .init_from(checkpoint));
                  }),
                  "--resume and --init-from exclude each other");
  expect_contains(error_of([&] {
                    make_run(lamp::Precision::kFP32,
                             TrainerOptions().init_from(checkpoint + ".none"));
                  }),
                  "no checkpoint at " + checkpoint + ".none");
  std::remove(checkpoint.c_str());
}

// The new run's checkpoints carry the source's history and the start.
TEST(Trainer, InitFromIsRecordedInTheNewRunsCheckpoints) {
  const auto source = temp_path("init_from_a.pt");
  const auto target = temp_path("init_from_b.pt");
  make_run(lamp::Precision::kFP32, TrainerOptions()
                                       .epochs(1)
                                       .schedule(Schedule::kConstant)
                                       .checkpoint(source))
      ->trainer->fit();
  make_run(lamp::Precision::kFP32, TrainerOptions()
                                       .epochs(2)
                                       .schedule(Schedule::kConstant)
                                       .resume(source)
                                       .checkpoint(source))
      ->trainer->fit();
  make_run(lamp::Precision::kFP32, TrainerOptions()
                                       .epochs(1)
                                       .schedule(Schedule::kCosine)
                                       .init_from(source)
                                       .checkpoint(target))
      ->trainer->fit();
  const auto weights = lamp::training::read_checkpoint_weights(target);
  EXPECT_EQ(weights.model_name, "smallnet");
  EXPECT_EQ(weights.epochs_done, 1);
  ASSERT_EQ(weights.history.size(), 2u);
  expect_entry(weights.history[0], "continued", 1, 1, 2, "");
  expect_entry(weights.history[1], "init_from", 0, 2, 1, source);
  std::remove(source.c_str());
  std::remove(target.c_str());
}

TEST(CheckpointWeights, AreThePythonStateDictsKeysAndFp32Masters) {
  const auto checkpoint = temp_path("weights_bf16.pt");
  auto run = make_run(lamp::Precision::kBF16,
                      TrainerOptions().epochs(1).checkpoint(checkpoint));
  run->trainer->fit();
  const auto weights = lamp::training::read_checkpoint_weights(checkpoint);
  const auto expected = weights_of(*run->trainer, *run->model);
  std::vector<std::string> keys, expected_keys;
  for (const auto& item : weights.tensors) {
    keys.push_back(item.key());
  }
  for (const auto& item : expected) {
    expected_keys.push_back(item.key());
  }
  EXPECT_EQ(keys, expected_keys);
  for (const auto& item : expected) {
    const auto& value = weights.tensors[item.key()];
    EXPECT_EQ(value.device().type(), torch::kCPU);
    EXPECT_TRUE(value.equal(item.value())) << item.key();
  }
  EXPECT_EQ(weights.tensors["fc.weight"].scalar_type(), torch::kFloat);
  EXPECT_EQ(weights.tensors["bn1.num_batches_tracked"].scalar_type(),
            torch::kLong);
  std::remove(checkpoint.c_str());
}

// SmallNet one level down ("inner.conv1.weight"), as a ResNet's blocks are
// ("layer1.0.conv1.weight").
struct WrappedImpl : torch::nn::Module {
  WrappedImpl() : inner(register_module("inner", lamp_test::SmallNet())) {}
  torch::Tensor forward(const torch::Tensor& x) { return inner->forward(x); }
  lamp_test::SmallNet inner;
};
TORCH_MODULE(Wrapped);

// A trainer of `model` on make_run()'s data, in FP32.
std::unique_ptr<Trainer> wrapped_trainer(Wrapped model,
                                         TrainerOptions options) {
  return std::make_unique<Trainer>(
      model.ptr(),
      [model](const torch::Tensor& x) mutable { return model->forward(x); },
      "wrapped",
      lamp::data::DeviceLoader(lamp_test::image_problem(true), torch::kCPU,
                               lamp_test::train_loader_options(32)),
      lamp::data::DeviceLoader(lamp_test::image_problem(false), torch::kCPU,
                               lamp::data::LoaderOptions(64).shuffle(false)),
      lamp_test::with(options, [](TrainerOptions& o) {
        o.step().precision(lamp::Precision::kFP32);
        o.optimizer().lr(0.05);
      }));
}

// Nested modules keep their parents' prefixes in a checkpoint's weights, and
// --init-from puts every tensor back where it came from.
TEST(CheckpointWeights, NestedModulesKeepTheirParentsPrefixes) {
  const auto checkpoint = temp_path("weights_nested.pt");
  torch::manual_seed(3);
  Wrapped trained;
  wrapped_trainer(trained, TrainerOptions().epochs(1).checkpoint(checkpoint))
      ->fit();
  std::vector<std::string> keys, expected;
  for (const auto& item :
       lamp::training::read_checkpoint_weights(checkpoint).tensors) {
    keys.push_back(item.key());
  }
  for (const auto& item : trained->named_parameters()) {
    expected.push_back(item.key());
  }
  for (const auto& item : trained->named_buffers()) {
    expected.push_back(item.key());
  }
  std::sort(keys.begin(), keys.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(keys, expected);
  EXPECT_NE(std::find(keys.begin(), keys.end(), "inner.bn1.running_mean"),
            keys.end());

  torch::manual_seed(4); // other initial weights
  Wrapped fresh;
  const auto trainer = wrapped_trainer(fresh, TrainerOptions()
                                                  .epochs(1)
                                                  .schedule(Schedule::kConstant)
                                                  .init_from(checkpoint));
  const auto params = fresh->named_parameters();
  for (const auto& item : trained->named_parameters()) {
    EXPECT_TRUE(params[item.key()].equal(item.value())) << item.key();
  }
  const auto buffers = fresh->named_buffers();
  for (const auto& item : trained->named_buffers()) {
    EXPECT_TRUE(buffers[item.key()].equal(item.value())) << item.key();
  }
  std::remove(checkpoint.c_str());
}

TEST(CheckpointWeights, RefuseAnotherModelOrShapeListingTheFirstDifferences) {
  const auto checkpoint = temp_path("weights_other.pt");
  make_run(lamp::Precision::kFP32,
           TrainerOptions().epochs(1).checkpoint(checkpoint))
      ->trainer->fit();
  // The same model built for 5 classes: another head.
  lamp_test::SmallNet five(5);
  const auto before = five->fc->weight.clone();
  auto error = error_of(
      [&] { lamp::training::load_weights_from_checkpoint(*five, checkpoint); });
  expect_contains(error, checkpoint +
                             " holds the weights of another model "
                             "('smallnet', 14 tensors) than this one "
                             "(14 tensors): 'fc.weight' is [4, 16] "
                             "there but [5, 16] here; 'fc.bias' is "
                             "[4] there but [5] here.");
  expect_contains(error, "Start from a checkpoint of this model");
  EXPECT_TRUE(five->fc->weight.equal(before)); // all or nothing
  EXPECT_TRUE(five->conv1->weight.defined());
  // Another model: the differences on both sides, the first five listed.
  torch::nn::Sequential other(torch::nn::Linear(3, 4), torch::nn::ReLU(),
                              torch::nn::Linear(4, 2));
  error = error_of([&] {
    lamp::training::load_weights_from_checkpoint(*other, checkpoint);
  });
  expect_contains(error,
                  "than this one (4 tensors): '0.weight' [4, 3] is not "
                  "in the checkpoint; '0.bias' [4] is not in the "
                  "checkpoint; '2.weight' [2, 4] is not in the "
                  "checkpoint; '2.bias' [2] is not in the checkpoint; "
                  "'conv1.weight' [8, 3, 3, 3] is not in this model; "
                  "and 13 more.");
  std::remove(checkpoint.c_str());
}

// ------------------------------------------------ export of any module tree

TEST(PythonStateDict, AnyModuleTreeHasPythonsKeysInPythonsOrder) {
  torch::manual_seed(3);
  CustomTree tree;
  const auto state = lamp::models::python_state_dict(*tree);
  std::vector<std::string> keys;
  for (const auto& item : state) {
    keys.push_back(item.key());
  }
  EXPECT_EQ(keys, kCustomTreeKeys);
  EXPECT_TRUE(state.at("blocks.1.scale")
                  .equal(tree->blocks[1]->as<lamp_test::BlockImpl>()->scale));
  EXPECT_EQ(state.at("blocks.0.body.1.num_batches_tracked").scalar_type(),
            torch::kLong);
  // Converted to BF16, it still exports FP32 by default.
  tree->to(torch::kBFloat16);
  for (const auto& item : lamp::models::python_state_dict(*tree)) {
    if (item.key().find("num_batches_tracked") == std::string::npos) {
      EXPECT_EQ(item.value().scalar_type(), torch::kFloat) << item.key();
    }
  }
}

TEST(PythonStateDict, AnyModuleTreeExportsAndReadsBack) {
  torch::manual_seed(4);
  CustomTree tree;
  const auto path = temp_path("custom_tree.pt");
  lamp::models::export_state_dict(*tree, path);
  const auto read = lamp::load_pickle(path, "the export").toGenericDict();
  const auto expected = lamp::models::python_state_dict(*tree);
  ASSERT_EQ(read.size(), expected.size());
  size_t i = 0;
  for (const auto& item : read) {
    ASSERT_LT(i, kCustomTreeKeys.size());
    EXPECT_EQ(item.key().toStringRef(), kCustomTreeKeys[i++]);
    EXPECT_TRUE(
        item.value().toTensor().equal(expected.at(item.key().toStringRef())));
  }
  std::remove(path.c_str());
}

} // namespace
