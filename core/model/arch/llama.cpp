#include "core/model/arch/arch.h"

namespace moelite {

// See docs/ARCHITECTURE.md and docs/moe-archs.md for the facts behind these traits.
extern const ArchDescriptor kArch_llama = {
    /*name=*/"llama",
    /*rope_style=*/RopeStyle::Normal,
    /*norm_topk=*/true,
    /*qk_norm=*/QkNorm::None,
    /*shared_expert=*/false,
    /*expert_activation=*/FfnActivation::SwiGLU,
    /*rope_factors=*/false,
    /*read_hparams=*/nullptr,
    /*bind_layer=*/nullptr,
    /*block=*/BlockKind::Standard,
};

}  // namespace moelite
