#include "core/model/arch/arch.h"

namespace moelite {

// See docs/ARCHITECTURE.md and docs/moe-archs.md for the facts behind these traits.
extern const ArchDescriptor kArch_qwen2moe = {
    /*name=*/"qwen2moe",
    /*rope_style=*/RopeStyle::Neox,
    /*norm_topk=*/false,
    /*qk_norm=*/QkNorm::None,
    /*shared_expert=*/true,
    /*expert_activation=*/FfnActivation::SwiGLU,
    /*rope_factors=*/false,
    /*read_hparams=*/nullptr,
    /*bind_layer=*/nullptr,
    /*block=*/BlockKind::Standard,
};

}  // namespace moelite
