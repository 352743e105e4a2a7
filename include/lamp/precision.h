#pragma once

/// \file
/// Forwarding header: this header moved to lamp/amp/precision.h in lamp 0.2.
/// Include that one; this forwarding header will be removed in lamp 0.3.

#include "lamp/amp/precision.h"
