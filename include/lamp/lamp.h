#pragma once

/// \file
/// Everything lamp offers, in namespace `lamp`.

#include "lamp/autocast.h"
#include "lamp/backends.h"
#include "lamp/data/datasets.h"
#include "lamp/data/loader.h"
#include "lamp/distributed.h"
#include "lamp/grad_scaler.h"
#include "lamp/half.h"
#include "lamp/master_weights.h"
#include "lamp/models/flops.h"
#include "lamp/models/mnist_cnn.h"
#include "lamp/models/resnet.h"
#include "lamp/models/state_dict.h"
#include "lamp/ops.h"
#include "lamp/optim/adam.h"
#include "lamp/optim/clip.h"
#include "lamp/optim/optimizer.h"
#include "lamp/optim/sgd.h"
#include "lamp/precision.h"
#include "lamp/report.h"
#include "lamp/train_step.h"
#include "lamp/training/checkpoint_file.h"
#include "lamp/training/schedule.h"
#include "lamp/training/trainer.h"
#include "lamp/version.h"
