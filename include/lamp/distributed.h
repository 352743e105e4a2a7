#pragma once

/// \file
/// Data-parallel training on LibTorch's own distributed engine (c10d, the
/// layer under Python's DistributedDataParallel): torchrun's environment
/// (lamp/distributed/environment.h), a process group
/// (lamp/distributed/process_group.h) and a gradient synchroniser with DDP's
/// semantics (lamp/distributed/data_parallel.h), which TrainStep and
/// Trainer use when given a process group of more than one rank.

#include "lamp/distributed/data_parallel.h"
#include "lamp/distributed/environment.h"
#include "lamp/distributed/process_group.h"
#include "lamp/distributed/shard_layout.h"
#include "lamp/distributed/sharded_optimizer.h"
