#include "base/types.h"

namespace moelite {

namespace {
// Block layouts from ggml's type traits. Removed ids (4, 5, 31-33, 36-38) stay empty.
constexpr TypeInfo kTypes[kTensorTypeIdLimit] = {
    /* 0*/ {"F32", 1, 4, true},         /* 1*/ {"F16", 1, 2, true},
    /* 2*/ {"Q4_0", 32, 18, true},      /* 3*/ {"Q4_1", 32, 20, true},
    /* 4*/ {nullptr, 0, 0, false},      /* 5*/ {nullptr, 0, 0, false},
    /* 6*/ {"Q5_0", 32, 22, true},      /* 7*/ {"Q5_1", 32, 24, true},
    /* 8*/ {"Q8_0", 32, 34, true},      /* 9*/ {"Q8_1", 32, 36, false},
    /*10*/ {"Q2_K", 256, 84, true},     /*11*/ {"Q3_K", 256, 110, true},
    /*12*/ {"Q4_K", 256, 144, true},    /*13*/ {"Q5_K", 256, 176, true},
    /*14*/ {"Q6_K", 256, 210, true},    /*15*/ {"Q8_K", 256, 292, false},
    /*16*/ {"IQ2_XXS", 256, 66, false}, /*17*/ {"IQ2_XS", 256, 74, false},
    /*18*/ {"IQ3_XXS", 256, 98, false}, /*19*/ {"IQ1_S", 256, 50, false},
    /*20*/ {"IQ4_NL", 32, 18, false},   /*21*/ {"IQ3_S", 256, 110, false},
    /*22*/ {"IQ2_S", 256, 82, false},   /*23*/ {"IQ4_XS", 256, 136, false},
    /*24*/ {"I8", 1, 1, false},         /*25*/ {"I16", 1, 2, false},
    /*26*/ {"I32", 1, 4, false},        /*27*/ {"I64", 1, 8, false},
    /*28*/ {"F64", 1, 8, false},        /*29*/ {"IQ1_M", 256, 56, false},
    /*30*/ {"BF16", 1, 2, true},        /*31*/ {nullptr, 0, 0, false},
    /*32*/ {nullptr, 0, 0, false},      /*33*/ {nullptr, 0, 0, false},
    /*34*/ {"TQ1_0", 256, 54, false},   /*35*/ {"TQ2_0", 256, 66, false},
    /*36*/ {nullptr, 0, 0, false},      /*37*/ {nullptr, 0, 0, false},
    /*38*/ {nullptr, 0, 0, false},      /*39*/ {"MXFP4", 32, 17, true},
};
}  // namespace

const TypeInfo* type_info(uint32_t id) {
  if (id >= kTensorTypeIdLimit || kTypes[id].name == nullptr) return nullptr;
  return &kTypes[id];
}

const char* type_name(TensorType t) {
  const TypeInfo* info = type_info(static_cast<uint32_t>(t));
  return info ? info->name : "unknown";
}

bool type_row_bytes(TensorType t, uint64_t n, uint64_t* out) {
  const TypeInfo* info = type_info(static_cast<uint32_t>(t));
  if (!info || n % info->block_size != 0) return false;
  uint64_t blocks = n / info->block_size;
  if (blocks > UINT64_MAX / info->block_bytes) return false;
  *out = blocks * info->block_bytes;
  return true;
}

}  // namespace moelite
