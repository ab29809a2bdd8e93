// A fixture for the ctest layering_accepts_downward: the runtime (core/exec/) may include the model
// (core/model/), an earlier stage.
#pragma once
#include "core/model/model.h"
