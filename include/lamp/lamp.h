#pragma once

/// \file
/// Everything lamp offers, in namespace `lamp`. The folders are its layers,
/// each using only those below it: platform/ (backends, device queries,
/// checkpoint files), ops/ (fused kernels) and optim/, amp/ (the
/// mixed-precision core), then distributed/, data/ and models/, and
/// training/ on top.

#include "lamp/amp/autocast.h"
#include "lamp/amp/grad_scaler.h"
#include "lamp/amp/gradient_sync.h"
#include "lamp/amp/half.h"
#include "lamp/amp/master_weights.h"
#include "lamp/amp/numerics_check.h"
#include "lamp/amp/precision.h"
#include "lamp/amp/precision_support.h"
#include "lamp/amp/report.h"
#include "lamp/amp/train_step.h"
#include "lamp/data/datasets.h"
#include "lamp/data/loader.h"
#include "lamp/data/text.h"
#include "lamp/distributed.h"
#include "lamp/models/flops.h"
#include "lamp/models/gpt.h"
#include "lamp/models/mnist_cnn.h"
#include "lamp/models/registry.h"
#include "lamp/models/resnet.h"
#include "lamp/models/state_dict.h"
#include "lamp/nn/attention.h"
#include "lamp/nn/norms.h"
#include "lamp/nn/rms_norm.h"
#include "lamp/ops/batch_norm_relu.h"
#include "lamp/ops/relu_max_pool.h"
#include "lamp/optim/adam.h"
#include "lamp/optim/clip.h"
#include "lamp/optim/decay_groups.h"
#include "lamp/optim/optimizer.h"
#include "lamp/optim/sgd.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/checkpoint_file.h"
#include "lamp/platform/hardware.h"
#include "lamp/platform/out_of_memory.h"
#include "lamp/platform/parameters.h"
#include "lamp/platform/warnings.h"
#include "lamp/training/checkpoint_weights.h"
#include "lamp/training/schedule.h"
#include "lamp/training/trainer.h"
#include "lamp/version.h"
