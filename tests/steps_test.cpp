// Runs measured in steps: the warm-up + cosine schedule by steps, a run
// length in steps that ends inside an epoch, evaluations and checkpoints
// every N steps, the best checkpoint, a stop that saves its step, and
// resumes from inside an epoch that continue bit for bit (a GPT with
// dropout, so that the random number streams are part of the test).
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "platform/paths.h"
#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp::training::BatchProgress;
using lamp::training::EpochStats;
using lamp::training::Schedule;
using lamp::training::StepEvaluation;
using lamp::training::Trainer;
using lamp::training::TrainerOptions;
using lamp_test::error_of;
using lamp_test::exists;
using lamp_test::temp_path;

// ------------------------------------------------------------- schedule

TEST(Schedule, WarmupCosineBySteps) {
  using lamp::training::learning_rate;
  EXPECT_EQ(lamp::training::parse_schedule("warmup-cosine"),
            Schedule::kWarmupCosine);
  EXPECT_EQ(lamp::training::to_string(Schedule::kWarmupCosine),
            "warmup-cosine");
  EXPECT_TRUE(lamp::training::depends_on_length(Schedule::kWarmupCosine));
  // Peak 1e-3, 10 warm-up steps of 110, floor 1e-4 (nanoGPT's shape).
  const auto lr = [&](int64_t step) {
    return learning_rate(Schedule::kWarmupCosine, 1e-3, step, 110, 10, 1e-4);
  };
  EXPECT_DOUBLE_EQ(lr(0), 1e-4);      // 1e-3 * 1/10
  EXPECT_DOUBLE_EQ(lr(4), 5e-4);      // linear: 5/10 of the peak
  EXPECT_DOUBLE_EQ(lr(9), 1e-3);      // the peak at warmup_steps - 1
  EXPECT_DOUBLE_EQ(lr(10), 1e-3);     // the cosine starts at the peak
  EXPECT_NEAR(lr(60), 5.5e-4, 1e-15); // half way: (peak + floor) / 2
  EXPECT_DOUBLE_EQ(lr(110), 1e-4);    // the floor at the end, and after
  EXPECT_LT(lr(109), lr(100));
  EXPECT_GT(lr(109), 1e-4);
  // The other schedules ignore the warm-up and the floor.
  EXPECT_DOUBLE_EQ(learning_rate(Schedule::kCosine, 0.2, 5, 10, 3, 0.1),
                   learning_rate(Schedule::kCosine, 0.2, 5, 10));
}

// ------------------------------------------------------- a GPT on text

// Bytes of a small repetitive text, as the trainer's text windows: 28
// training windows of 8 (7 batches of 4), 23 validation windows (4 batches
// of 6).
struct TextRun {
  lamp::models::GPT gpt{nullptr};
  std::unique_ptr<Trainer> trainer;
};

lamp::data::Dataset windows(bool train) {
  std::string text;
  for (int i = 0; i < 30; ++i) {
    text += i % 3 == 0 ? "the cat sat. " : "a dog ran on. ";
  }
  auto bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  const int64_t cut = 28 * 8 + 1;
  return lamp::data::text_windows(
      train ? bytes.slice(0, 0, cut) : bytes.slice(0, cut - 1), 8);
}

// A GPT with dropout (the global generator's stream matters) trained with
// AdamW, clipping and the warm-up + cosine schedule; `change` adds the
// case's options. `poison`, asked at each training forward, makes that
// step's logits (and so its loss) non-finite when it answers true.
std::unique_ptr<TextRun> text_run(
    const std::function<void(TrainerOptions&)>& change,
    lamp::Precision precision = lamp::Precision::kFP32,
    const std::function<bool()>& poison = nullptr) {
  auto run = std::make_unique<TextRun>();
  torch::manual_seed(11);
  const auto shape = lamp::models::GPTOptions()
                         .layers(1)
                         .heads(2)
                         .width(16)
                         .context(8)
                         .dropout(0.2);
  run->gpt = lamp::models::GPT(shape);
  auto gpt = run->gpt;
  auto options = TrainerOptions(precision)
                     .epochs(3)
                     .schedule(Schedule::kWarmupCosine)
                     .warmup_steps(3)
                     .min_lr(1e-3)
                     .task(lamp::training::Task::language_model())
                     .option_name(lamp_test::flag_name);
  options.optimizer().name("adamw").lr(1e-2).weight_decay(0.1).beta2(0.99);
  options.step().max_grad_norm(1.0);
  change(options);
  run->trainer = std::make_unique<Trainer>(
      gpt.ptr(),
      [gpt, poison](const torch::Tensor& x) mutable {
        auto logits = gpt->forward(x);
        if (poison && gpt->is_training() && poison()) {
          logits = logits * std::numeric_limits<float>::infinity();
        }
        return logits;
      },
      shape.name(),
      lamp::data::DeviceLoader(
          windows(true), torch::kCPU,
          lamp::data::LoaderOptions(4).dtype(torch::kLong).seed(3)),
      lamp::data::DeviceLoader(
          windows(false), torch::kCPU,
          lamp::data::LoaderOptions(6).shuffle(false).dtype(torch::kLong)),
      options);
  return run;
}

// Every parameter of the two models equal to the bit.
void expect_same_weights(lamp::models::GPT& a, lamp::models::GPT& b,
                         const std::string& what) {
  const auto pa = a->named_parameters();
  const auto pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()]))
        << what << ": " << item.key() << " differs";
  }
}

// The run's length in steps sizes the schedule: 17 steps of 7-step epochs
// end 3 steps into epoch 3, whose checkpoint holds that position.
TEST(StepRuns, StepsSizeTheScheduleAndEndInsideAnEpoch) {
  const auto checkpoint = temp_path("steps.pt");
  std::remove(checkpoint.c_str());
  std::vector<double> lrs;
  std::vector<EpochStats> stats;
  {
    auto run = text_run(
        [&](TrainerOptions& o) { o.steps(17).checkpoint(checkpoint); });
    EXPECT_EQ(run->trainer->total_steps(), 17);
    stats = run->trainer->fit(
        nullptr, [&](const BatchProgress& p) { lrs.push_back(p.lr); });
    EXPECT_TRUE(run->trainer->finished());
  }
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_FALSE(stats[1].partial());
  EXPECT_TRUE(stats[2].partial());
  EXPECT_EQ(stats[2].steps, 3);
  EXPECT_EQ(stats[2].global_step, 17);
  EXPECT_TRUE(stats[2].checkpoint_written);
  ASSERT_EQ(lrs.size(), 17u);
  for (int64_t step = 0; step < 17; ++step) {
    EXPECT_DOUBLE_EQ(lrs[step],
                     lamp::training::warmup_cosine_lr(1e-2, step, 3, 17, 1e-3))
        << "step " << step;
  }
  // The finished run resumes as finished, at the step it ended on.
  auto again =
      text_run([&](TrainerOptions& o) { o.steps(17).resume(checkpoint); });
  EXPECT_TRUE(again->trainer->finished());
  EXPECT_EQ(again->trainer->global_step(), 17);
  EXPECT_EQ(again->trainer->start_epoch(), 2);
  EXPECT_EQ(again->trainer->start_step_in_epoch(), 3);
  EXPECT_TRUE(again->trainer->fit().empty());
  std::remove(checkpoint.c_str());
}

// A checkpoint inside an epoch resumes to the same weights, losses and
// evaluations as the run that went straight on, at several points: the
// first steps, mid-epoch, an epoch's end and the next epoch's middle.
TEST(StepRuns, AResumeFromInsideAnEpochIsBitIdentical) {
  const auto setup = [](TrainerOptions& o) { o.steps(18).eval_every(6); };
  auto straight = text_run(setup);
  std::vector<StepEvaluation> want_evals;
  const auto want = straight->trainer->fit(
      nullptr, nullptr, nullptr,
      [&](const StepEvaluation& e) { want_evals.push_back(e); });
  ASSERT_EQ(want.size(), 3u);
  ASSERT_EQ(want_evals.size(), 3u); // steps 6, 12, 18
  for (const int64_t at : {1, 3, 7, 10}) {
    const auto checkpoint = temp_path("inside.pt");
    std::remove(checkpoint.c_str());
    {
      auto first = text_run([&](TrainerOptions& o) {
        setup(o);
        o.max_steps(at).checkpoint(checkpoint);
      });
      first->trainer->fit();
    }
    auto resumed = text_run([&](TrainerOptions& o) {
      setup(o);
      o.resume(checkpoint);
    });
    EXPECT_EQ(resumed->trainer->global_step(), at);
    EXPECT_EQ(resumed->trainer->start_step_in_epoch(), at % 7);
    std::vector<StepEvaluation> got_evals;
    const auto got = resumed->trainer->fit(
        nullptr, nullptr, nullptr,
        [&](const StepEvaluation& e) { got_evals.push_back(e); });
    expect_same_weights(straight->gpt, resumed->gpt,
                        "resumed at step " + std::to_string(at));
    // The epochs it finished report the straight run's losses, the one it
    // resumed inside included (its sums travel in the checkpoint).
    ASSERT_FALSE(got.empty());
    const auto& last = got.back();
    EXPECT_EQ(last.train_loss, want.back().train_loss) << "at " << at;
    EXPECT_EQ(got.front().epoch, at / 7 + 1);
    EXPECT_EQ(got.front().resumed_steps, at % 7);
    EXPECT_EQ(got.front().train_loss, want[at / 7].train_loss) << "at " << at;
    ASSERT_FALSE(got_evals.empty());
    EXPECT_EQ(got_evals.back().test_loss, want_evals.back().test_loss);
    std::remove(checkpoint.c_str());
  }
}

// Evaluations every N steps and at the end; the best checkpoint follows the
// lowest test loss, which a resume carries on; the epochs are not
// evaluated twice.
TEST(StepRuns, EvaluatesEveryNStepsAndKeepsTheBestCheckpoint) {
  const auto checkpoint = temp_path("last.pt");
  const auto best = temp_path("best.pt");
  std::remove(checkpoint.c_str());
  std::remove(best.c_str());
  std::vector<StepEvaluation> evals;
  std::vector<EpochStats> epochs;
  {
    auto run = text_run([&](TrainerOptions& o) {
      o.steps(18).eval_every(4).checkpoint(checkpoint).best_checkpoint(best);
    });
    epochs =
        run->trainer->fit(nullptr, nullptr, nullptr,
                          [&](const StepEvaluation& e) { evals.push_back(e); });
  }
  std::vector<int64_t> at;
  double lowest = std::numeric_limits<double>::infinity();
  for (const auto& e : evals) {
    at.push_back(e.global_step);
    EXPECT_EQ(e.best_written, e.test_loss < lowest) << e.global_step;
    lowest = std::min(lowest, e.test_loss);
    EXPECT_EQ(e.best_test_loss, lowest);
    EXPECT_TRUE(std::isfinite(e.train_loss) && e.train_loss > 0);
    EXPECT_EQ(e.test_examples, 23);
  }
  // Every 4 steps, and at the run's end (18, not a multiple of 4).
  EXPECT_EQ(at, (std::vector<int64_t>{4, 8, 12, 16, 18}));
  for (const auto& s : epochs) {
    EXPECT_FALSE(s.evaluated);
  }
  ASSERT_TRUE(exists(best));
  // The best checkpoint resumes at the step of the lowest loss.
  int64_t best_step = 0;
  for (const auto& e : evals) {
    if (e.best_written) {
      best_step = e.global_step;
    }
  }
  auto from_best = text_run(
      [&](TrainerOptions& o) { o.steps(18).eval_every(4).resume(best); });
  EXPECT_EQ(from_best->trainer->global_step(), best_step);
  std::remove(checkpoint.c_str());
  std::remove(best.c_str());
}

// eval_at_start: an evaluation before the first step (nanoGPT's step 0),
// of the untrained model, that trains, saves and counts nothing: the run's
// weights and later evaluations are the run's without it, to the bit, and
// its first evaluation after training is still its first best.
TEST(StepRuns, EvalAtStartEvaluatesTheUntrainedModelAndChangesNothing) {
  const auto checkpoint = temp_path("at_start.pt");
  const auto best = temp_path("at_start_best.pt");
  std::vector<StepEvaluation> evals[2];
  lamp::models::GPT trained[2];
  double untrained_loss = 0;
  for (const bool at_start : {true, false}) {
    std::remove(checkpoint.c_str());
    std::remove(best.c_str());
    auto run = text_run([&](TrainerOptions& o) {
      o.steps(10)
          .eval_every(4)
          .checkpoint_every(4)
          .eval_at_start(at_start)
          .checkpoint(checkpoint)
          .best_checkpoint(best);
    });
    if (at_start) {
      untrained_loss = run->trainer->evaluate().first;
    }
    auto& mine = evals[at_start ? 0 : 1];
    run->trainer->fit(nullptr, nullptr, nullptr, [&](const StepEvaluation& e) {
      mine.push_back(e);
      // Nothing written at the start: no checkpoint of step 0 on disk.
      if (e.before_training) {
        EXPECT_FALSE(exists(checkpoint));
        EXPECT_FALSE(exists(best));
      }
    });
    trained[at_start ? 0 : 1] = run->gpt;
  }
  ASSERT_EQ(evals[0].size(), 4u);
  ASSERT_EQ(evals[1].size(), 3u);
  const auto& first = evals[0][0];
  EXPECT_TRUE(first.before_training);
  EXPECT_EQ(first.global_step, 0);
  EXPECT_EQ(first.epoch, 1);
  EXPECT_TRUE(std::isnan(first.train_loss));
  EXPECT_EQ(first.test_loss, untrained_loss);
  EXPECT_EQ(first.test_examples, 23);
  EXPECT_FALSE(first.best_written);
  EXPECT_FALSE(first.checkpoint_written);
  EXPECT_EQ(first.best_test_loss, std::numeric_limits<double>::infinity());
  // The first step's rate: a third of the way up the warm-up.
  EXPECT_DOUBLE_EQ(first.lr, 1e-2 / 3);
  for (size_t k = 0; k < evals[1].size(); ++k) {
    const auto& with = evals[0][k + 1];
    const auto& without = evals[1][k];
    EXPECT_FALSE(with.before_training);
    EXPECT_EQ(with.global_step, without.global_step);
    EXPECT_EQ(with.train_loss, without.train_loss) << with.global_step;
    EXPECT_EQ(with.test_loss, without.test_loss) << with.global_step;
    EXPECT_EQ(with.best_written, without.best_written) << with.global_step;
    EXPECT_EQ(with.checkpoint_written, without.checkpoint_written);
  }
  EXPECT_TRUE(evals[0][1].best_written);
  expect_same_weights(trained[0], trained[1], "with and without eval_at_start");
  std::remove(checkpoint.c_str());
  std::remove(best.c_str());
}

// A resumed run's start evaluation is at the step it resumes (its weights
// as loaded); a stop asked for during it writes nothing; without
// eval_every it is refused.
TEST(StepRuns, EvalAtStartOfAResumeAStopInItAndWithoutEvalEvery) {
  const auto checkpoint = temp_path("at_start_resume.pt");
  std::remove(checkpoint.c_str());
  double loss_at_6 = 0;
  {
    auto run = text_run([&](TrainerOptions& o) {
      o.steps(10).max_steps(6).checkpoint(checkpoint);
    });
    run->trainer->fit();
    loss_at_6 = run->trainer->evaluate().first;
  }
  std::vector<StepEvaluation> evals;
  auto resumed = text_run([&](TrainerOptions& o) {
    o.steps(10).eval_every(4).eval_at_start(true).resume(checkpoint);
  });
  resumed->trainer->fit(nullptr, nullptr, nullptr,
                        [&](const StepEvaluation& e) { evals.push_back(e); });
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_TRUE(evals[0].before_training);
  EXPECT_EQ(evals[0].global_step, 6);
  EXPECT_EQ(evals[0].test_loss, loss_at_6);
  EXPECT_EQ(evals[1].global_step, 8);
  EXPECT_EQ(evals[2].global_step, 10);

  const auto stopped_path = temp_path("at_start_stop.pt");
  std::remove(stopped_path.c_str());
  int evaluations = 0;
  auto stopped = text_run([&](TrainerOptions& o) {
    o.steps(10).eval_every(4).eval_at_start(true).checkpoint(stopped_path);
    o.stop_requested([] { return true; });
  });
  stopped->trainer->fit(nullptr, nullptr, nullptr,
                        [&](const StepEvaluation&) { ++evaluations; });
  EXPECT_EQ(evaluations, 0);
  EXPECT_TRUE(stopped->trainer->stop_point().stopped);
  EXPECT_EQ(stopped->trainer->stop_point().global_step, 0);
  EXPECT_FALSE(exists(stopped_path));

  const auto message = error_of(
      [] { text_run([](TrainerOptions& o) { o.eval_at_start(true); }); });
  EXPECT_NE(message.find("--eval-at-start adds an evaluation before the first "
                         "step to those of --eval-every, which is off; give "
                         "it too."),
            std::string::npos)
      << message;
  std::remove(checkpoint.c_str());
  std::remove(stopped_path.c_str());
}

// An evaluation that does not improve on the best leaves the best
// checkpoint as it was: a learning rate far too high makes the validation
// loss go up and down, and the best checkpoint stays at the lowest.
TEST(StepRuns, AWorseEvaluationLeavesTheBestCheckpoint) {
  const auto best = temp_path("worse.best.pt");
  std::remove(best.c_str());
  std::vector<StepEvaluation> evals;
  {
    auto run = text_run([&](TrainerOptions& o) {
      o.steps(20).eval_every(2).best_checkpoint(best).optimizer().lr(0.3);
    });
    run->trainer->fit(nullptr, nullptr, nullptr,
                      [&](const StepEvaluation& e) { evals.push_back(e); });
  }
  double lowest = std::numeric_limits<double>::infinity();
  int64_t lowest_step = 0, worse = 0;
  for (const auto& e : evals) {
    const bool better = e.test_loss < lowest;
    EXPECT_EQ(e.best_written, better) << "step " << e.global_step;
    worse += better ? 0 : 1;
    if (better) {
      lowest = e.test_loss;
      lowest_step = e.global_step;
    }
    EXPECT_EQ(e.best_test_loss, lowest) << "step " << e.global_step;
  }
  ASSERT_GT(worse, 0) << "the case needs an evaluation that is not the best";
  EXPECT_EQ(lamp::training::read_checkpoint_settings(best).global_step,
            lowest_step);
  std::remove(best.c_str());
}

// A best test loss measured on another subset of the test set (a resume
// that evaluates more or fewer batches) is no measure of the next
// evaluation's: the first evaluation after such a resume is the new best,
// whichever subset's loss is the lower. At a learning rate of 1e-12 the
// weights hardly move, so one of the two directions below would keep the
// old subset's best if it were compared.
TEST(StepRuns, ABestOfAnotherEvaluationSubsetStartsAfresh) {
  const auto checkpoint = temp_path("subset.pt");
  for (const auto& limits : {std::pair<int64_t, int64_t>{1, 0}, {0, 1}}) {
    std::remove(checkpoint.c_str());
    const auto setup = [](TrainerOptions& o) {
      o.steps(4).eval_every(2).min_lr(0).optimizer().lr(1e-12);
    };
    double first_best = 0;
    text_run([&](TrainerOptions& o) {
      setup(o);
      o.max_steps(2).checkpoint(checkpoint).limit_eval_batches(limits.first);
    })->trainer->fit(nullptr, nullptr, nullptr, [&](const StepEvaluation& e) {
      first_best = e.best_test_loss;
    });
    std::vector<StepEvaluation> after;
    text_run([&](TrainerOptions& o) {
      setup(o);
      o.resume(checkpoint).limit_eval_batches(limits.second);
    })->trainer->fit(nullptr, nullptr, nullptr, [&](const StepEvaluation& e) {
      after.push_back(e);
    });
    ASSERT_EQ(after.size(), 1u);
    EXPECT_NE(after[0].test_loss, first_best);
    EXPECT_EQ(after[0].best_test_loss, after[0].test_loss)
        << "limits " << limits.first << " then " << limits.second;
  }
  std::remove(checkpoint.c_str());
}

// A resumed run carries on the lowest test loss of the run before the
// stop: an evaluation after the resume that is worse than that best leaves
// the best checkpoint alone, and the evaluations report the straight run's
// best loss. (Starting afresh from inf, the first evaluation after every
// resume would replace the best checkpoint, however bad.) A learning rate
// far too high makes the validation loss go up and down.
TEST(StepRuns, AResumedRunKeepsTheBestTestLoss) {
  const auto setup = [](TrainerOptions& o) {
    o.steps(20).eval_every(2).optimizer().lr(0.3);
  };
  const auto straight_best = temp_path("keeps.straight.best.pt");
  std::vector<StepEvaluation> want;
  {
    auto straight = text_run([&](TrainerOptions& o) {
      setup(o);
      o.best_checkpoint(straight_best);
    });
    straight->trainer->fit(nullptr, nullptr, nullptr,
                           [&](const StepEvaluation& e) { want.push_back(e); });
  }
  std::remove(straight_best.c_str());
  // Stop at the evaluation before the first one that is not the best.
  size_t worse = 1;
  while (worse < want.size() && want[worse].best_written) {
    ++worse;
  }
  ASSERT_LT(worse, want.size())
      << "the case needs an evaluation that is not the best";
  const int64_t cut = want[worse - 1].global_step;
  const auto checkpoint = temp_path("keeps.pt");
  const auto best = temp_path("keeps.best.pt");
  std::remove(checkpoint.c_str());
  std::remove(best.c_str());
  const auto paths = [&](TrainerOptions& o) {
    setup(o);
    o.checkpoint(checkpoint).best_checkpoint(best);
  };
  {
    auto first = text_run([&](TrainerOptions& o) {
      paths(o);
      o.max_steps(cut);
    });
    first->trainer->fit();
  }
  std::vector<StepEvaluation> got;
  auto resumed = text_run([&](TrainerOptions& o) {
    paths(o);
    o.resume(checkpoint);
  });
  ASSERT_EQ(resumed->trainer->global_step(), cut);
  resumed->trainer->fit(nullptr, nullptr, nullptr,
                        [&](const StepEvaluation& e) { got.push_back(e); });
  ASSERT_EQ(got.size(), want.size() - worse);
  int64_t best_step = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].best_written) {
      best_step = want[i].global_step;
    }
    if (i < worse) {
      continue;
    }
    const auto& e = got[i - worse];
    EXPECT_EQ(e.global_step, want[i].global_step);
    EXPECT_EQ(e.test_loss, want[i].test_loss) << "step " << e.global_step;
    EXPECT_EQ(e.best_test_loss, want[i].best_test_loss)
        << "step " << e.global_step;
    EXPECT_EQ(e.best_written, want[i].best_written) << "step " << e.global_step;
  }
  EXPECT_EQ(lamp::training::read_checkpoint_settings(best).global_step,
            best_step);
  std::remove(checkpoint.c_str());
  std::remove(best.c_str());
}

// A checkpoint written by an evaluation at an epoch's last step (here
// checkpoint_every and the best checkpoint at step 7 of 7-step epochs),
// before the epoch ends, holds the next epoch's start: both files resume
// there, and the resumed run ends as the straight one, to the bit. (The
// epoch's end writes nothing more at that step, so the evaluation's file
// is the one a user continues from.)
TEST(StepRuns, AnEvaluationAtAnEpochsLastStepWritesAResumableCheckpoint) {
  const auto checkpoint = temp_path("epoch_end.pt");
  const auto best = temp_path("epoch_end.best.pt");
  const auto setup = [&](TrainerOptions& o) {
    o.steps(14).eval_every(7).checkpoint_every(7).checkpoint(checkpoint);
  };
  std::remove(checkpoint.c_str());
  std::remove(best.c_str());
  {
    auto first = text_run([&](TrainerOptions& o) {
      setup(o);
      o.best_checkpoint(best).max_steps(7);
    });
    std::vector<StepEvaluation> evals;
    first->trainer->fit(nullptr, nullptr, nullptr,
                        [&](const StepEvaluation& e) { evals.push_back(e); });
    ASSERT_EQ(evals.size(), 1u);
    EXPECT_TRUE(evals[0].checkpoint_written);
    EXPECT_TRUE(evals[0].best_written);
  }
  const auto straight_checkpoint = temp_path("epoch_end.straight.pt");
  std::remove(straight_checkpoint.c_str());
  auto straight = text_run([&](TrainerOptions& o) {
    setup(o);
    o.checkpoint(straight_checkpoint);
  });
  straight->trainer->fit();
  // Each resume writes a third file, leaving the two it reads as they are.
  const auto continued = temp_path("epoch_end.continued.pt");
  for (const auto& from : {checkpoint, best}) {
    auto resumed = text_run([&](TrainerOptions& o) {
      setup(o);
      o.resume(from).checkpoint(continued);
    });
    EXPECT_EQ(resumed->trainer->global_step(), 7) << from;
    EXPECT_EQ(resumed->trainer->start_epoch(), 1) << from;
    EXPECT_EQ(resumed->trainer->start_step_in_epoch(), 0) << from;
    resumed->trainer->fit();
    expect_same_weights(straight->gpt, resumed->gpt, "resumed from " + from);
  }
  std::remove(checkpoint.c_str());
  std::remove(best.c_str());
  std::remove(straight_checkpoint.c_str());
  std::remove(continued.c_str());
}

// The evaluations a run reported, field by field, against another's.
void expect_same_evaluations(const std::vector<StepEvaluation>& got,
                             const std::vector<StepEvaluation>& want,
                             const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(what + ", evaluation at step " +
                 std::to_string(want[i].global_step));
    EXPECT_EQ(got[i].global_step, want[i].global_step);
    EXPECT_EQ(got[i].epoch, want[i].epoch);
    EXPECT_EQ(got[i].train_loss, want[i].train_loss);
    EXPECT_EQ(got[i].test_loss, want[i].test_loss);
    EXPECT_EQ(got[i].lr, want[i].lr);
    EXPECT_EQ(got[i].best_test_loss, want[i].best_test_loss);
  }
}

// A stop asked for during training or during a step's evaluation writes
// the checkpoint at that step; the resumed run ends where the straight one
// does, to the bit, and reports its evaluations: the one a stop
// interrupted runs first, and each one's training loss covers the steps
// since the one before, those before the resume too.
TEST(StepRuns, AStopSavesItsStepAndResumesBitIdentically) {
  const auto setup = [](TrainerOptions& o) { o.steps(14).eval_every(5); };
  auto straight = text_run(setup);
  std::vector<StepEvaluation> straight_evaluations;
  straight->trainer->fit(
      nullptr, nullptr, nullptr,
      [&](const StepEvaluation& e) { straight_evaluations.push_back(e); });
  ASSERT_EQ(straight_evaluations.size(), 3u); // steps 5, 10 and 14
  struct Case {
    const char* name;
    int64_t stop_at_call; // stop_requested's call that answers true
    int64_t step;         // the step saved
    bool in_evaluation;
  };
  // stop_requested is asked before each step and each evaluation batch (4
  // of them per evaluation here): calls 1-5 are steps 1-5, 6-9 the
  // evaluation at step 5.
  for (const auto& c :
       {Case{"training", 4, 3, false}, Case{"evaluation", 7, 5, true}}) {
    const auto checkpoint = temp_path("stop.pt");
    std::remove(checkpoint.c_str());
    int64_t calls = 0;
    std::vector<StepEvaluation> evaluations;
    const auto keep = [&](const StepEvaluation& e) {
      evaluations.push_back(e);
    };
    {
      auto first = text_run([&](TrainerOptions& o) {
        setup(o);
        o.checkpoint(checkpoint).stop_requested([&] {
          return ++calls == c.stop_at_call;
        });
      });
      first->trainer->fit(nullptr, nullptr, nullptr, keep);
      const auto& stop = first->trainer->stop_point();
      EXPECT_TRUE(stop.stopped) << c.name;
      EXPECT_EQ(stop.in_evaluation, c.in_evaluation) << c.name;
      EXPECT_EQ(stop.global_step, c.step) << c.name;
      EXPECT_EQ(stop.checkpoint_step, c.step) << c.name;
    }
    auto resumed = text_run([&](TrainerOptions& o) {
      setup(o);
      o.checkpoint(checkpoint).resume(checkpoint);
    });
    EXPECT_EQ(resumed->trainer->global_step(), c.step) << c.name;
    resumed->trainer->fit(nullptr, nullptr, nullptr, keep);
    expect_same_weights(straight->gpt, resumed->gpt, c.name);
    expect_same_evaluations(evaluations, straight_evaluations, c.name);
    std::remove(checkpoint.c_str());
  }
}

// The run's last evaluation stopped: every step is trained, and the
// resumed run (which trains nothing) runs that evaluation, once: the
// checkpoint it wrote no longer says it is pending.
TEST(StepRuns, AStopInTheLastEvaluationIsRunByTheResume) {
  const auto setup = [](TrainerOptions& o) { o.steps(7).eval_every(7); };
  auto straight = text_run(setup);
  std::vector<StepEvaluation> want;
  straight->trainer->fit(nullptr, nullptr, nullptr,
                         [&](const StepEvaluation& e) { want.push_back(e); });
  ASSERT_EQ(want.size(), 1u);
  const auto checkpoint = temp_path("stop_last_eval.pt");
  std::remove(checkpoint.c_str());
  int64_t calls = 0;
  text_run([&](TrainerOptions& o) {
    setup(o);
    // Calls 1-7 come before the steps, 8 before the evaluation's first
    // batch.
    o.checkpoint(checkpoint).stop_requested([&] { return ++calls == 8; });
  })->trainer->fit();
  for (const int64_t expected : {1, 0}) {
    std::vector<StepEvaluation> got;
    auto resumed = text_run([&](TrainerOptions& o) {
      setup(o);
      o.checkpoint(checkpoint).resume(checkpoint);
    });
    EXPECT_TRUE(resumed->trainer->finished());
    resumed->trainer->fit(nullptr, nullptr, nullptr,
                          [&](const StepEvaluation& e) { got.push_back(e); });
    ASSERT_EQ(static_cast<int64_t>(got.size()), expected);
    if (expected == 1) {
      expect_same_evaluations(got, want, "the resume");
    }
  }
  std::remove(checkpoint.c_str());
}

// A stop during the evaluation at the end of an epoch that a resume
// started inside says where it stopped in the epoch's terms: after all 7
// steps (3 of them before the resume), not the 4 this run took.
TEST(StepRuns, AStopInAResumedEpochsEvaluationCountsTheWholeEpoch) {
  const auto checkpoint = temp_path("stop_resumed_eval.pt");
  std::remove(checkpoint.c_str());
  text_run([&](TrainerOptions& o) {
    o.max_steps(3).checkpoint(checkpoint);
  })->trainer->fit();
  int64_t calls = 0;
  auto resumed = text_run([&](TrainerOptions& o) {
    // Calls 1-4 come before steps 4-7, call 5 before the first evaluation
    // batch.
    o.resume(checkpoint).checkpoint(checkpoint).stop_requested([&] {
      return ++calls == 5;
    });
  });
  resumed->trainer->fit();
  const auto& stop = resumed->trainer->stop_point();
  EXPECT_TRUE(stop.stopped);
  EXPECT_TRUE(stop.in_evaluation);
  EXPECT_EQ(stop.epoch, 1);
  EXPECT_EQ(stop.steps, 7);
  EXPECT_EQ(stop.steps_in_epoch, 7);
  EXPECT_EQ(stop.global_step, 7);
  EXPECT_EQ(stop.checkpoint_step, 7);
  std::remove(checkpoint.c_str());
}

// A fresh run stopped before its first step has trained nothing: it writes
// no checkpoint (one of step 0 would be refused by every resume), and its
// stop point says none was written.
TEST(StepRuns, AStopBeforeTheFirstStepWritesNothing) {
  const auto checkpoint = temp_path("stop_at_start.pt");
  std::remove(checkpoint.c_str());
  auto run = text_run([&](TrainerOptions& o) {
    o.steps(14).checkpoint(checkpoint).stop_requested([] { return true; });
  });
  run->trainer->fit();
  const auto& stop = run->trainer->stop_point();
  EXPECT_TRUE(stop.stopped);
  EXPECT_EQ(stop.global_step, 0);
  EXPECT_EQ(stop.checkpoint_step, -1);
  EXPECT_FALSE(exists(checkpoint));
  std::remove(checkpoint.c_str());
}

// Evaluations every 2 steps and checkpoints every 4: only the evaluations
// at a multiple of 4 write the checkpoint.
TEST(StepRuns, EvaluationsWriteTheCheckpointOnlyAtCheckpointEvery) {
  const auto checkpoint = temp_path("eval_every_2.pt");
  std::remove(checkpoint.c_str());
  std::vector<std::pair<int64_t, bool>> written;
  {
    auto run = text_run([&](TrainerOptions& o) {
      o.steps(10).eval_every(2).checkpoint_every(4).checkpoint(checkpoint);
    });
    run->trainer->fit(nullptr, nullptr, nullptr, [&](const StepEvaluation& e) {
      written.emplace_back(e.global_step, e.checkpoint_written);
    });
  }
  EXPECT_EQ(written,
            (std::vector<std::pair<int64_t, bool>>{
                {2, false}, {4, true}, {6, false}, {8, true}, {10, false}}));
  std::remove(checkpoint.c_str());
}

// A schedule that depends on the run's length (warm-up + cosine) does not
// continue with more steps: the learning rate would jump at the resume. A
// constant schedule does.
TEST(StepRuns, MoreStepsContinueOnlyAConstantSchedule) {
  const auto checkpoint = temp_path("more_steps.pt");
  for (const auto schedule : {Schedule::kWarmupCosine, Schedule::kConstant}) {
    std::remove(checkpoint.c_str());
    // The constant schedule without text_run's warm-up and floor.
    const auto with_schedule = [&](TrainerOptions& o) {
      o.schedule(schedule);
      if (schedule == Schedule::kConstant) {
        o.warmup_steps(0).min_lr(0.0);
      }
    };
    {
      auto first = text_run([&](TrainerOptions& o) {
        with_schedule(o);
        o.steps(14).max_steps(5).checkpoint(checkpoint);
      });
      first->trainer->fit();
    }
    const auto error = error_of([&] {
      text_run([&](TrainerOptions& o) {
        with_schedule(o);
        o.steps(20).resume(checkpoint);
      });
    });
    if (schedule == Schedule::kConstant) {
      EXPECT_EQ(error, "");
    } else {
      EXPECT_NE(error.find("was trained for 14 steps with"), std::string::npos)
          << error;
      EXPECT_NE(error.find("a run of 20 steps follows another curve"),
                std::string::npos)
          << error;
    }
  }
  std::remove(checkpoint.c_str());
}

// A run resumed from one checkpoint and writing another (a branch of the
// run, or a copy on other storage) has written nothing to the new path
// yet: a stop before its first step writes the new checkpoint at the
// resumed step, the stop point names it, and it resumes to the straight
// run's end, to the bit.
TEST(StepRuns, AStopRightAfterAResumeIntoAnotherPathWritesIt) {
  const auto setup = [](TrainerOptions& o) { o.steps(14); };
  auto straight = text_run(setup);
  straight->trainer->fit();
  const auto from = temp_path("branch.from.pt");
  const auto to = temp_path("branch.to.pt");
  std::remove(from.c_str());
  std::remove(to.c_str());
  {
    auto first = text_run([&](TrainerOptions& o) {
      setup(o);
      o.max_steps(5).checkpoint(from);
    });
    first->trainer->fit();
  }
  {
    auto branch = text_run([&](TrainerOptions& o) {
      setup(o);
      o.resume(from).checkpoint(to).stop_requested([] { return true; });
    });
    branch->trainer->fit();
    const auto& stop = branch->trainer->stop_point();
    EXPECT_TRUE(stop.stopped);
    EXPECT_EQ(stop.global_step, 5);
    EXPECT_EQ(stop.checkpoint_step, 5);
  }
  ASSERT_TRUE(exists(to)) << "the stop wrote no checkpoint at " << to;
  EXPECT_EQ(lamp::training::read_checkpoint_settings(to).global_step, 5);
  auto resumed = text_run([&](TrainerOptions& o) {
    setup(o);
    o.resume(to);
  });
  resumed->trainer->fit();
  expect_same_weights(straight->gpt, resumed->gpt, "resumed from " + to);
  std::remove(from.c_str());
  std::remove(to.c_str());
}

// A resume inside an epoch carries on the epoch's count of non-finite
// losses (steps skipped for inf/NaN) as well as its loss sum: the epoch's
// mean over its finite losses and its count of non-finite ones are the
// straight run's. Training steps 2 and 4 have non-finite losses; the
// checkpoint is at step 5, in the first epoch.
TEST(StepRuns, AResumeInsideAnEpochKeepsItsNonFiniteLosses) {
  const auto setup = [](TrainerOptions& o) { o.steps(14); };
  int64_t step = 0; // the training forwards so far, of all runs' steps
  const auto poison = [&] {
    ++step;
    return step == 2 || step == 4;
  };
  auto straight = text_run(setup, lamp::Precision::kFP32, poison);
  const auto want = straight->trainer->fit();
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(want[0].non_finite_losses, 2);
  ASSERT_EQ(want[0].skipped_steps, 2);
  const auto checkpoint = temp_path("non_finite.pt");
  // A run to `at` steps writing the checkpoint, then the run resumed from it.
  const auto resumed_at = [&](int64_t at) {
    std::remove(checkpoint.c_str());
    step = 0;
    {
      auto first = text_run(
          [&](TrainerOptions& o) {
            setup(o);
            o.max_steps(at).checkpoint(checkpoint);
          },
          lamp::Precision::kFP32, poison);
      first->trainer->fit();
    }
    EXPECT_EQ(step, at);
    return text_run(
        [&](TrainerOptions& o) {
          setup(o);
          o.resume(checkpoint);
        },
        lamp::Precision::kFP32, poison);
  };
  auto resumed = resumed_at(5);
  const auto got = resumed->trainer->fit();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].resumed_steps, 5);
  EXPECT_EQ(got[0].non_finite_losses, 2);
  EXPECT_EQ(got[0].train_loss, want[0].train_loss);
  EXPECT_EQ(got[1].train_loss, want[1].train_loss);
  expect_same_weights(straight->gpt, resumed->gpt, "resumed at step 5");
  // At the epoch's end (step 7) the count starts again for the next epoch:
  // that checkpoint resumes too, into the second epoch as the straight run.
  auto next_epoch = resumed_at(7);
  EXPECT_EQ(next_epoch->trainer->start_epoch(), 1);
  const auto second = next_epoch->trainer->fit();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].non_finite_losses, 0);
  EXPECT_EQ(second[0].train_loss, want[1].train_loss);
  expect_same_weights(straight->gpt, next_epoch->gpt, "resumed at step 7");
  std::remove(checkpoint.c_str());
}

// checkpoint_every writes inside epochs; without a checkpoint path it is
// refused, as are the other step options' bad values, each naming its
// option.
TEST(StepRuns, RefusesBadStepOptionsNamingThem) {
  const auto refused = [](const std::function<void(TrainerOptions&)>& change) {
    return error_of([&] { text_run(change); });
  };
  EXPECT_NE(refused([](TrainerOptions& o) {
              o.steps(-1);
            }).find("--steps must be >= 0"),
            std::string::npos);
  EXPECT_NE(refused([](TrainerOptions& o) {
              o.steps(22);
            }).find("give --epochs 4 or more"),
            std::string::npos);
  EXPECT_NE(refused([](TrainerOptions& o) { o.steps(5).warmup_steps(5); })
                .find("--warmup-steps 5 must be >= 0 and shorter than the "
                      "run's 5 steps"),
            std::string::npos);
  EXPECT_NE(refused([](TrainerOptions& o) {
              o.min_lr(0.5);
            }).find("--min-lr 0.5 must be in [0, --lr 0.01]"),
            std::string::npos);
  EXPECT_NE(refused([](TrainerOptions& o) { o.schedule(Schedule::kCosine); })
                .find("--warmup-steps and --min-lr shape --schedule "
                      "warmup-cosine, not cosine"),
            std::string::npos);
  EXPECT_NE(refused([](TrainerOptions& o) { o.checkpoint_every(3); })
                .find("--checkpoint-every says how often to write "
                      "--checkpoint, which is not given"),
            std::string::npos);
  EXPECT_NE(
      refused([](TrainerOptions& o) { o.best_checkpoint(temp_path("b.pt")); })
          .find("--best-checkpoint is written after the evaluations of "
                "--eval-every, which is off"),
      std::string::npos);
  // The best checkpoint is another file than the checkpoint (whatever its
  // spelling) and than the weights the run starts from.
  const auto named = temp_path("same.pt");
  const auto folder = lamp::detail::parent_folder(named);
  const auto dotted = folder + "/./" + lamp::detail::base_name(named);
  EXPECT_NE(refused([&](TrainerOptions& o) {
              o.eval_every(2).checkpoint(named).best_checkpoint(dotted);
            })
                .find(" are the same file; give the best checkpoint its own "
                      "name"),
            std::string::npos);
  EXPECT_NE(refused([&](TrainerOptions& o) {
              o.eval_every(2).init_from(named).best_checkpoint(dotted);
            })
                .find(" are the same file, which the run's first evaluation "
                      "would write over"),
            std::string::npos);
  EXPECT_NE(refused([](TrainerOptions& o) {
              o.eval_every(3).step().accumulation_steps(7);
            })
                .find("--eval-every 3 is not a multiple of the 7 "
                      "--accumulation-steps"),
            std::string::npos);
}

// checkpoint_every writes the file inside epochs: the file's step advances
// with the run.
TEST(StepRuns, CheckpointEveryWritesInsideEpochs) {
  const auto checkpoint = temp_path("every.pt");
  std::remove(checkpoint.c_str());
  {
    auto run = text_run([&](TrainerOptions& o) {
      o.steps(10).checkpoint(checkpoint).checkpoint_every(3).max_steps(5);
    });
    const auto history = run->trainer->fit();
    // The one written inside the epoch (step 3) is timed apart from its
    // training; its end's (step 5) comes after the epoch's times.
    ASSERT_EQ(history.size(), 1u);
    EXPECT_TRUE(history[0].partial());
    EXPECT_GT(history[0].checkpoint_seconds, 0.0);
    EXPECT_GT(history[0].seconds, 0.0);
  }
  // Steps 3 (inside epoch 1) and 5 (the run's end).
  const auto settings = lamp::training::read_checkpoint_settings(checkpoint);
  EXPECT_EQ(settings.global_step, 5);
  std::remove(checkpoint.c_str());
  auto stopped_early = text_run([&](TrainerOptions& o) {
    o.steps(10)
        .checkpoint(checkpoint)
        .checkpoint_every(3)
        .stop_requested([n = 0]() mutable { return ++n == 5; });
  });
  stopped_early->trainer->fit();
  // The stop came before step 5, after step 4: the file holds step 4.
  EXPECT_EQ(lamp::training::read_checkpoint_settings(checkpoint).global_step,
            4);
  std::remove(checkpoint.c_str());
}

// The program's settings travel in the checkpoint; a checked one that
// differs on resume is refused with every difference, an unchecked one (a
// path to the data) is not.
TEST(StepRuns, ProgramSettingsAreStoredAndChecked) {
  const auto checkpoint = temp_path("program.pt");
  std::remove(checkpoint.c_str());
  const std::vector<lamp::training::ProgramSetting> settings = {
      {"--layers", "1"}, {"--dropout", "0.2"}, {"--data", "a.txt", false}};
  {
    auto run = text_run([&](TrainerOptions& o) {
      o.steps(6).checkpoint(checkpoint).program_settings(settings);
    });
    run->trainer->fit();
  }
  const auto stored = lamp::training::read_checkpoint_settings(checkpoint);
  ASSERT_EQ(stored.program_settings.size(), 3u);
  EXPECT_EQ(stored.program_settings[1].name, "--dropout");
  EXPECT_EQ(stored.program_settings[1].value, "0.2");
  EXPECT_FALSE(stored.program_settings[2].checked);
  // Another data path resumes; another dropout and layers are refused.
  auto moved = settings;
  moved[2].value = "b.txt";
  EXPECT_NO_THROW(text_run([&](TrainerOptions& o) {
    o.steps(6).resume(checkpoint).program_settings(moved);
  }));
  auto other = settings;
  other[0].value = "2";
  other[1].value = "0";
  const auto error = error_of([&] {
    text_run([&](TrainerOptions& o) {
      o.steps(6).resume(checkpoint).program_settings(other);
    });
  });
  EXPECT_NE(error.find("--layers 1 there, 2 here; --dropout 0.2 there, 0 "
                       "here; resume with --layers 1 --dropout 0.2"),
            std::string::npos)
      << error;
  std::remove(checkpoint.c_str());
}

// ---------------------------------------------------------- escaping

TEST(EscapeText, KeepsUtf8AndEscapesEveryOtherByte) {
  using lamp::data::escape_text;
  EXPECT_EQ(escape_text("plain text\n\tok"), "plain text\n\tok");
  EXPECT_EQ(escape_text("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(escape_text(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(escape_text("\x1B[2J\x7F\r"), "\\x1B[2J\\x7F\\x0D");
  EXPECT_EQ(escape_text("back\\slash"), "back\\\\slash");
  // Ill-formed: a lone continuation byte, a cut sequence, an overlong
  // form, a surrogate, beyond U+10FFFF, a lead byte that never starts one.
  EXPECT_EQ(escape_text("\x80"), "\\x80");
  EXPECT_EQ(escape_text("\xE2\x82"), "\\xE2\\x82");
  EXPECT_EQ(escape_text("\xC0\xAF"), "\\xC0\\xAF");
  EXPECT_EQ(escape_text("\xED\xA0\x80"), "\\xED\\xA0\\x80");
  EXPECT_EQ(escape_text("\xF4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");
  EXPECT_EQ(escape_text("\xFF"), "\\xFF");
}

} // namespace
