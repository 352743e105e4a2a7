#pragma once

/// \file
/// Everything lamp offers, in namespace `lamp`.

#include "lamp/autocast.h"
#include "lamp/backends.h"
#include "lamp/grad_scaler.h"
#include "lamp/half.h"
#include "lamp/master_weights.h"
#include "lamp/precision.h"
#include "lamp/train_step.h"
#include "lamp/version.h"
