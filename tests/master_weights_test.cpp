#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>

#include "lamp/amp/master_weights.h"
#include "test_util.h"

namespace {

using lamp_test::BitEqual;
using lamp_test::expect_error;

// Low-precision "model parameters" with gradients, as after a backward pass.
std::vector<torch::Tensor> half_params_with_grads(torch::Dtype dtype,
                                                  uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params = {
      torch::randn({4, 3}).to(dtype).requires_grad_(),
      torch::randn({5}).to(dtype).requires_grad_(),
      torch::randn({2, 2, 3}).requires_grad_()}; // an FP32 one, like BatchNorm
  for (auto& p : params) {
    p.mutable_grad() = (torch::randn(p.sizes()) * 1024).to(p.scalar_type());
  }
  return params;
}

TEST(MasterWeights, CopiesAreFP32LeavesWithTheModelsValues) {
  for (bool flat : {false, true}) {
    auto params = half_params_with_grads(torch::kHalf, 1);
    lamp::MasterWeights master(params, flat);
    ASSERT_EQ(master.master_params().size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& m = master.master_params()[i];
      EXPECT_EQ(m.scalar_type(), torch::kFloat);
      EXPECT_TRUE(m.is_leaf());
      EXPECT_TRUE(m.requires_grad());
      EXPECT_TRUE(BitEqual(m.detach(), params[i].detach().to(torch::kFloat)));
      EXPECT_NE(m.data_ptr(), params[i].data_ptr()) << "must be a copy";
    }
    EXPECT_EQ(master.flat(), flat);
  }
}

// torch::save / torch::load round-trip the FP32 values (not re-made from
// the FP16 model), into the existing master tensors.
TEST(MasterWeights, TorchSaveAndLoadKeepTheFp32Values) {
  for (bool flat : {false, true}) {
    auto params = half_params_with_grads(torch::kHalf, 1);
    lamp::MasterWeights saved(params, flat);
    {
      torch::NoGradGuard no_grad;
      for (auto& m : saved.master_params()) {
        m.add_(1e-4); // below FP16's resolution near 1: only FP32 keeps it
      }
    }
    std::stringstream stream;
    torch::save(saved, stream);
    lamp::MasterWeights loaded(params, flat);
    const auto before = loaded.master_params()[0].data_ptr();
    // The model's values before the load (which copies the masters into
    // it): the masters loaded are not these.
    std::vector<torch::Tensor> model_values;
    for (const auto& p : params) {
      model_values.push_back(p.detach().to(torch::kFloat).clone());
    }
    torch::load(loaded, stream);
    EXPECT_EQ(loaded.master_params()[0].data_ptr(), before);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(BitEqual(loaded.master_params()[i].detach(),
                           saved.master_params()[i].detach()));
      EXPECT_FALSE(
          BitEqual(loaded.master_params()[i].detach(), model_values[i]));
    }
  }
}

// load() leaves the model as the masters it loaded say: its 16-bit weights
// follow them, not the values the model was built with (a resume's first
// forward pass, or an evaluation straight after the load, would otherwise
// run on those).
TEST(MasterWeights, LoadCopiesTheMastersToTheModel) {
  for (bool flat : {false, true}) {
    auto trained = half_params_with_grads(torch::kHalf, 1);
    lamp::MasterWeights saved(trained, flat);
    {
      torch::NoGradGuard no_grad;
      for (auto& m : saved.master_params()) {
        m.mul_(-2).add_(0.25);
      }
    }
    saved.master_params_to_model_params();
    std::stringstream stream;
    torch::save(saved, stream);
    auto built = half_params_with_grads(torch::kHalf, 2);
    lamp::MasterWeights loaded(built, flat);
    torch::load(loaded, stream);
    for (size_t i = 0; i < built.size(); ++i) {
      EXPECT_TRUE(BitEqual(built[i].detach(), trained[i].detach()))
          << "parameter " << i << (flat ? ", flat masters" : "");
    }
  }
}

// Named masters are saved under their names and found by name, also when
// the parameters come in another order; lamp 0.1's positional archives still
// load (by position); a named archive needs named masters.
TEST(MasterWeights, NamedArchivesKeyByNameAndPositionalOnesStillLoad) {
  const auto params = half_params_with_grads(torch::kHalf, 1);
  const std::vector<std::string> names = {"fc.weight", "fc.bias", "bn.weight"};
  lamp::MasterWeights named(params, /*flat=*/false);
  named.set_parameter_names(names);
  lamp::MasterWeights unnamed(params, /*flat=*/false);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      named.master_params()[i].fill_(static_cast<double>(i + 1));
      unnamed.master_params()[i].fill_(static_cast<double>(10 * (i + 1)));
    }
  }
  std::stringstream by_name, by_position;
  torch::save(named, by_name);
  torch::save(unnamed, by_position);
  {
    torch::serialize::InputArchive archive;
    archive.load_from(by_name);
    const auto keys = archive.keys();
    for (const auto& name : names) {
      EXPECT_NE(std::find(keys.begin(), keys.end(), name), keys.end()) << name;
    }
    by_name.clear();
    by_name.seekg(0);
  }
  // The same parameters, listed in reverse.
  const std::vector<torch::Tensor> reversed(params.rbegin(), params.rend());
  lamp::MasterWeights loaded(reversed, /*flat=*/false);
  loaded.set_parameter_names({names.rbegin(), names.rend()});
  torch::load(loaded, by_name);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(loaded.master_params()[params.size() - 1 - i].min().item<float>(),
              static_cast<float>(i + 1))
        << names[i];
  }
  // A positional archive into named masters: by position.
  lamp::MasterWeights old(params, /*flat=*/false);
  old.set_parameter_names(names);
  torch::load(old, by_position);
  EXPECT_EQ(old.master_params()[2].min().item<float>(), 30.0f);
  // A named archive into unnamed masters, or with a name missing: refused,
  // unchanged.
  by_name.clear();
  by_name.seekg(0);
  lamp::MasterWeights anonymous(params, /*flat=*/false);
  expect_error(
      [&] { torch::load(anonymous, by_name); },
      "keys the master tensors by parameter name, but these master weights have no names");
  by_name.clear();
  by_name.seekg(0);
  lamp::MasterWeights renamed(params, /*flat=*/false);
  renamed.set_parameter_names({"fc.weight", "fc.bias", "norm.weight"});
  expect_error([&] { torch::load(renamed, by_name); },
               "the archive has no master tensor 2 ('norm.weight')");
  EXPECT_TRUE(BitEqual(renamed.master_params()[0].detach(),
                       params[0].detach().to(torch::kFloat)));
}

TEST(MasterWeights, FlatMastersAreViewsOfOneBuffer) {
  auto params = half_params_with_grads(torch::kBFloat16, 2);
  lamp::MasterWeights master(params, /*flat=*/true);
  const auto& buffer = master.flat_buffer();
  ASSERT_TRUE(buffer.defined());
  EXPECT_EQ(buffer.numel(), 12 + 5 + 12);
  auto* base = buffer.data_ptr<float>();
  int64_t offset = 0;
  for (const auto& m : master.master_params()) {
    EXPECT_EQ(m.data_ptr<float>(), base + offset);
    offset += m.numel();
  }
  master.model_grads_to_master_grads();
  EXPECT_EQ(master.master_params()[1].grad().data_ptr<float>(),
            master.flat_grad_buffer().data_ptr<float>() + 12);
}

// Optimizers detach gradients in place in zero_grad(); the flat gradient
// views must allow it, iteration after iteration.
TEST(MasterWeights, FlatGradientsSurviveOptimizerZeroGrad) {
  auto params = half_params_with_grads(torch::kHalf, 8);
  lamp::MasterWeights master(params, /*flat=*/true);
  torch::optim::SGD sgd(master.master_params(), 0.1);
  for (int step = 0; step < 3; ++step) {
    master.model_grads_to_master_grads();
    sgd.step();
    sgd.zero_grad();
  }
  master.model_grads_to_master_grads();
  EXPECT_TRUE(BitEqual(master.master_params()[0].grad(),
                       params[0].grad().to(torch::kFloat)));
}

TEST(MasterWeights, GradientCopyWithAndWithoutUnscale) {
  for (bool flat : {false, true}) {
    auto params = half_params_with_grads(torch::kHalf, 3);
    lamp::MasterWeights master(params, flat);
    master.model_grads_to_master_grads();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(BitEqual(master.master_params()[i].grad(),
                           params[i].grad().to(torch::kFloat)));
    }
    // A power-of-two scale unscales exactly.
    master.model_grads_to_master_grads(/*loss_scale=*/1024.0);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(BitEqual(master.master_params()[i].grad(),
                           params[i].grad().to(torch::kFloat) / 1024));
    }
    EXPECT_THROW(master.model_grads_to_master_grads(0.0), c10::Error);
  }
}

// The names key the saved masters: a repeated name (each module's own
// named_parameters()) would save one master over another and load it into
// both; the archive's own keys would clash with save()'s entries.
TEST(MasterWeights, SetParameterNamesRefusesRepeatedEmptyAndReservedNames) {
  auto params = half_params_with_grads(torch::kHalf, 7);
  params.push_back(torch::randn({4, 3}).to(torch::kHalf).requires_grad_());
  lamp::MasterWeights master(params, /*flat=*/false);
  expect_error(
      [&] {
        master.set_parameter_names({"weight", "bias", "bn", "weight"});
      },
      "parameters 0 and 3 are both named 'weight'; the names key the saved masters and must be unique");
  expect_error(
      [&] {
        master.set_parameter_names({"a", "", "b", "c"});
      },
      "parameter 1 has an empty name");
  for (const std::string reserved : {"count", "keyed_by"}) {
    expect_error(
        [&] {
          master.set_parameter_names({"a", "b", reserved, "c"});
        },
        "parameter 2 is named '" + reserved +
            "', a name the saved archive uses for itself");
  }
  // Refused names leave the masters unnamed: saved by position, each
  // master comes back as itself.
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      master.master_params()[i].fill_(static_cast<double>(i + 1));
    }
  }
  std::stringstream stream;
  torch::save(master, stream);
  lamp::MasterWeights loaded(params, /*flat=*/false);
  torch::load(loaded, stream);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(loaded.master_params()[i].min().item<float>(),
              static_cast<float>(i + 1))
        << i;
  }
}

// A loss scale whose inverse FP32 cannot hold would make every gradient
// inf/NaN (1/1e-40) or zero (1/1e46): refused, the gradients untouched.
TEST(MasterWeights, RefusesALossScaleWhoseInverseFp32CannotHold) {
  for (bool flat : {false, true}) {
    auto params = half_params_with_grads(torch::kHalf, 8);
    lamp::MasterWeights master(params, flat);
    master.model_grads_to_master_grads();
    const auto before = master.master_params()[0].grad().clone();
    for (double scale : {1e-40, 1e46}) {
      expect_error([&] { master.model_grads_to_master_grads(scale); },
                   "is not representable in float32");
      EXPECT_TRUE(BitEqual(master.master_params()[0].grad(), before));
    }
  }
}

// An Embedding with sparse=true gives a sparse gradient: the master gets it
// as a sparse FP32 gradient (coalesced in FP32, unscaled), which the
// optimizers step; a flat master cannot hold one and says so.
TEST(MasterWeights, SparseGradientsBecomeSparseFp32MasterGradients) {
  for (bool flat : {false, true}) {
    auto params = half_params_with_grads(torch::kHalf, 9);
    auto table = torch::zeros({10, 4}, torch::kHalf).requires_grad_();
    // Row 1 twice: 60000 + 60000 overflows FP16 unless coalesced in FP32.
    const auto indices = torch::tensor({1, 1, 3}, torch::kLong).view({1, 3});
    const auto values = torch::full({3, 4}, 60000.0, torch::kHalf);
    table.mutable_grad() =
        torch::sparse_coo_tensor(indices, values, {10, 4}).to(torch::kHalf);
    params.push_back(table);
    lamp::MasterWeights master(params, flat);
    for (int round = 0; round < 2; ++round) {
      master.model_grads_to_master_grads(/*loss_scale=*/2.0);
      const auto grad = master.master_params().back().grad();
      ASSERT_TRUE(grad.defined());
      EXPECT_TRUE(grad.is_sparse());
      EXPECT_EQ(grad.scalar_type(), torch::kFloat);
      auto expected = torch::zeros({10, 4});
      expected[1].fill_(60000.0);
      expected[3].fill_(30000.0);
      EXPECT_TRUE(BitEqual(grad.to_dense(), expected)) << "round " << round;
      // The dense ones as before.
      EXPECT_TRUE(BitEqual(master.master_params()[0].grad(),
                           params[0].grad().to(torch::kFloat) / 2));
    }
    torch::optim::SGD sgd(master.master_params(), 1.0);
    sgd.step();
    const auto rows = master.master_params().back().detach();
    EXPECT_EQ(rows[1].min().item<float>(), -60000.0f);
    EXPECT_EQ(rows[3].min().item<float>(), -30000.0f);
    EXPECT_EQ(rows[0].abs().max().item<float>(), 0.0f);
    // A dense gradient after a sparse one.
    table.mutable_grad() = torch::ones({10, 4}, torch::kHalf);
    master.model_grads_to_master_grads();
    EXPECT_FALSE(master.master_params().back().grad().is_sparse());
    EXPECT_TRUE(
        BitEqual(master.master_params().back().grad(), torch::ones({10, 4})));
  }
  auto model = torch::zeros({10, 4}, torch::kHalf).requires_grad_();
  model.mutable_grad() =
      torch::sparse_coo_tensor(torch::tensor({2}, torch::kLong).view({1, 1}),
                               torch::ones({1, 4}, torch::kHalf), {10, 4});
  const std::vector<torch::Tensor> model_params = {model};
  const std::vector<torch::Tensor> per_tensor = {
      torch::zeros({10, 4}).requires_grad_()};
  lamp::model_grads_to_master_grads(model_params, per_tensor,
                                    /*flat_master=*/false);
  EXPECT_TRUE(per_tensor[0].grad().is_sparse());
  const std::vector<torch::Tensor> flat_master = {
      torch::zeros({40}).requires_grad_()};
  expect_error(
      [&] {
        lamp::model_grads_to_master_grads(model_params, flat_master,
                                          /*flat_master=*/true);
      },
      "parameter 0 has a sparse gradient (an Embedding with sparse=true), which a flat master cannot hold");
}

TEST(MasterWeights, MissingModelGradLeavesMasterWithoutOneAndUnchanged) {
  for (bool flat : {false, true}) {
    auto params = half_params_with_grads(torch::kHalf, 4);
    params[1].mutable_grad() = torch::Tensor();
    lamp::MasterWeights master(params, flat);
    const auto before = master.master_params()[1].detach().clone();
    master.model_grads_to_master_grads();
    EXPECT_FALSE(master.master_params()[1].grad().defined());
    EXPECT_TRUE(master.master_params()[0].grad().defined());
    torch::optim::SGD sgd(master.master_params(), 0.1);
    sgd.step();
    EXPECT_TRUE(BitEqual(master.master_params()[1].detach(), before));
  }
}

// Weights loaded into the model after the masters were made reach them
// with model_params_to_master_params(), in place (flat or not), so that the
// copy back keeps them; without it the masters' old values overwrite them.
TEST(MasterWeights, TakesTheModelsWeightsBack) {
  for (const bool flat : {false, true}) {
    SCOPED_TRACE(flat ? "flat" : "per tensor");
    torch::manual_seed(2);
    torch::nn::Linear layer(4, 3);
    layer->to(torch::kBFloat16);
    lamp::MasterWeights master(layer->parameters(), flat);
    const auto before = master.master_params()[0].data_ptr();
    const auto loaded = torch::randn({3, 4}).to(torch::kBFloat16);
    {
      torch::NoGradGuard no_grad;
      layer->weight.copy_(loaded);
    }
    master.model_params_to_master_params();
    EXPECT_EQ(master.master_params()[0].data_ptr(), before);
    EXPECT_EQ(master.master_params()[0].scalar_type(), torch::kFloat);
    EXPECT_TRUE(
        torch::equal(master.master_params()[0], loaded.to(torch::kFloat)));
    EXPECT_TRUE(master.master_params()[0].requires_grad());
    if (flat) {
      EXPECT_TRUE(
          torch::equal(master.flat_buffer().narrow(0, 0, 12).view({3, 4}),
                       loaded.to(torch::kFloat)));
    }
    master.master_params_to_model_params();
    EXPECT_TRUE(torch::equal(layer->weight, loaded));
  }
}

TEST(MasterWeights, RoundTripBackToTheModel) {
  for (bool flat : {false, true}) {
    auto params = half_params_with_grads(torch::kBFloat16, 5);
    lamp::MasterWeights master(params, flat);
    {
      torch::NoGradGuard no_grad;
      for (auto& m : master.master_params()) {
        m.add_(0.25);
      }
    }
    master.master_params_to_model_params();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].scalar_type(),
                i == 2 ? torch::kFloat : torch::kBFloat16);
      EXPECT_TRUE(BitEqual(
          params[i].detach(),
          master.master_params()[i].detach().to(params[i].scalar_type())));
    }
  }
}

TEST(MasterWeights, FlatAndPerTensorGiveIdenticalTraining) {
  auto a = half_params_with_grads(torch::kHalf, 6);
  auto b = half_params_with_grads(torch::kHalf, 6);
  lamp::MasterWeights per_tensor(a, false), flat(b, true);
  torch::optim::SGD sgd_a(per_tensor.master_params(),
                          torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD sgd_b(flat.master_params(),
                          torch::optim::SGDOptions(0.01).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    per_tensor.model_grads_to_master_grads(512.0);
    flat.model_grads_to_master_grads(512.0);
    sgd_a.step();
    sgd_b.step();
    per_tensor.master_params_to_model_params();
    flat.master_params_to_model_params();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(BitEqual(per_tensor.master_params()[i].detach(),
                         flat.master_params()[i].detach()));
    EXPECT_TRUE(BitEqual(a[i].detach(), b[i].detach()));
  }
}

TEST(MasterWeights, SaveAndLoadKeepTheSameTensors) {
  auto params = half_params_with_grads(torch::kHalf, 7);
  lamp::MasterWeights master(params, true);
  const auto saved = master.master_params()[0].detach().clone();
  std::stringstream stream;
  {
    torch::serialize::OutputArchive archive;
    master.save(archive);
    archive.save_to(stream);
  }
  const auto* impl = master.master_params()[0].unsafeGetTensorImpl();
  {
    torch::NoGradGuard no_grad;
    master.master_params()[0].fill_(3.0);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  master.load(archive);
  EXPECT_TRUE(BitEqual(master.master_params()[0].detach(), saved));
  EXPECT_EQ(master.master_params()[0].unsafeGetTensorImpl(), impl);
}

// A MasterWeights archive: "count" and one tensor per index.
std::shared_ptr<torch::serialize::InputArchive> masters_archive(
    const c10::IValue& count, const std::vector<torch::Tensor>& tensors) {
  torch::serialize::OutputArchive out;
  out.write("count", count);
  for (size_t i = 0; i < tensors.size(); ++i) {
    out.write(std::to_string(i), tensors[i]);
  }
  return lamp_test::reopened(out);
}

// Every tensor is checked (shape, dtype, finite values) before the first is
// copied: a refused load leaves all masters as they were.
TEST(MasterWeights, RefusedLoadChangesNoMaster) {
  for (bool flat : {false, true}) {
    lamp::MasterWeights master(half_params_with_grads(torch::kHalf, 3), flat);
    std::vector<torch::Tensor> before;
    std::vector<torch::Tensor> good;
    for (const auto& m : master.master_params()) {
      before.push_back(m.detach().clone());
      good.push_back(torch::full(m.sizes(), 0.5f));
    }
    auto with = [&](size_t i, const torch::Tensor& t) {
      auto tensors = good;
      tensors[i] = t;
      return tensors;
    };
    const c10::IValue three(int64_t{3});
    auto nan = good[1].clone();
    nan[2] = std::numeric_limits<float>::quiet_NaN();
    auto inf = good[2].clone();
    inf[1][0][0] = -std::numeric_limits<float>::infinity();
    const std::vector<
        std::pair<std::shared_ptr<torch::serialize::InputArchive>, std::string>>
        corrupt = {
            {masters_archive(three, with(1, nan)),
             "lamp::MasterWeights::load: master tensor 1 holds non-finite values (NaN or inf)"},
            {masters_archive(three, with(2, inf)),
             "master tensor 2 holds non-finite values"},
            {masters_archive(three, with(2, torch::zeros({2, 3, 2}))),
             "master tensor 2 has shape [2, 3, 2] in the archive but [2, 2, 3] here"},
            {masters_archive(three, with(1, good[1].to(torch::kDouble))),
             "master tensor 1 has dtype double in the archive but float here"},
            {masters_archive(three, {good[0], good[1]}),
             "the archive has no master tensor 2"},
            {masters_archive(c10::IValue(int64_t{2}), good),
             "the archive holds 2 master tensors but this model has 3"},
            {masters_archive(c10::IValue(std::string("3")), good),
             "lamp::MasterWeights::load: 'count' has type String in the archive where an integer is expected"},
        };
    for (const auto& item : corrupt) {
      expect_error([&] { master.load(*item.first); }, item.second);
      for (size_t i = 0; i < before.size(); ++i) {
        EXPECT_TRUE(BitEqual(master.master_params()[i].detach(), before[i]))
            << "master " << i << " after: " << item.second;
      }
    }
    master.load(*masters_archive(three, good));
    EXPECT_TRUE(BitEqual(master.master_params()[1].detach(), good[1]));
  }
}

TEST(MasterWeights, RejectsEmptyAndNonFloatingParameters) {
  EXPECT_THROW(lamp::MasterWeights({}), c10::Error);
  EXPECT_THROW(lamp::MasterWeights({torch::arange(3)}), c10::Error);
}

TEST(Fp16Util, PrepParamListsSkipsFrozenParameters) {
  torch::nn::Linear linear(3, 2);
  linear->bias.requires_grad_(false);
  auto lists = lamp::prep_param_lists(*linear);
  ASSERT_EQ(lists.first.size(), 1u);
  ASSERT_EQ(lists.second.size(), 1u);
  EXPECT_TRUE(lists.first[0].is_same(linear->weight));
  EXPECT_EQ(lists.second[0].scalar_type(), torch::kFloat);
  auto flat = lamp::prep_param_lists(*linear, /*flat_master=*/true);
  ASSERT_EQ(flat.second.size(), 1u);
  EXPECT_EQ(flat.second[0].numel(), 6);
  EXPECT_TRUE(flat.second[0].grad().defined());
}

TEST(Fp16Util, CopyFunctionsMatchApexInBothLayouts) {
  torch::nn::Linear linear(3, 2);
  linear->to(torch::kHalf);
  for (bool flat : {false, true}) {
    auto lists = lamp::prep_param_lists(*linear, flat);
    linear->weight.mutable_grad() = torch::full({2, 3}, 2.0, torch::kHalf);
    linear->bias.mutable_grad() = torch::full({2}, -1.0, torch::kHalf);
    lamp::model_grads_to_master_grads(lists.first, lists.second, flat);
    if (flat) {
      EXPECT_TRUE(BitEqual(
          lists.second[0].grad(),
          torch::cat({torch::full({6}, 2.0), torch::full({2}, -1.0)})));
    } else {
      EXPECT_TRUE(BitEqual(lists.second[1].grad(), torch::full({2}, -1.0)));
    }
    {
      torch::NoGradGuard no_grad;
      for (auto& m : lists.second) {
        m.fill_(0.5);
      }
    }
    lamp::master_params_to_model_params(lists.first, lists.second, flat);
    EXPECT_TRUE(
        BitEqual(linear->bias.detach(), torch::full({2}, 0.5, torch::kHalf)));
    EXPECT_TRUE(BitEqual(linear->weight.detach(),
                         torch::full({2, 3}, 0.5, torch::kHalf)));
  }
  auto lists = lamp::prep_param_lists(*linear);
  EXPECT_THROW(
      lamp::model_grads_to_master_grads(lists.first, {lists.second[0]}),
      c10::Error);
  // Shapes must pair up: copy_ would otherwise broadcast silently.
  EXPECT_THROW(lamp::master_params_to_model_params({linear->bias},
                                                   {torch::zeros({3, 2})}),
               c10::Error);
  EXPECT_THROW(lamp::master_params_to_model_params(
                   lists.first, {torch::zeros({7})}, /*flat_master=*/true),
               c10::Error);
  // A flat master of the right count but not 1-D FP32: lamp's message, not
  // narrow()'s or copy_()'s.
  for (const auto& flat :
       {torch::zeros({2, 4}), torch::zeros({8}, torch::kHalf)}) {
    try {
      lamp::master_params_to_model_params(lists.first, {flat},
                                          /*flat_master=*/true);
      FAIL() << "took a flat master of shape " << flat.sizes() << " and "
             << flat.scalar_type();
    } catch (const c10::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the master must be one contiguous 1-D FP32 tensor"),
                std::string::npos)
          << what;
    }
  }
}

} // namespace
