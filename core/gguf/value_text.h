// GGUF metadata values as text, for moelite_model_meta_value: strings as stored, numbers in
// decimal (floats with round-trip precision), booleans as true/false, arrays as JSON arrays.
#pragma once
#include <string>

#include "core/gguf/reader.h"

namespace moelite::gguf {

std::string value_to_text(const Value& v);

}  // namespace moelite::gguf
