// A fixture for the ctest layering_rejects_upward: loading (core/model/) must not include the
// runtime that executes a model (core/exec/), a later stage.
#pragma once
#include "core/exec/runtime.h"
