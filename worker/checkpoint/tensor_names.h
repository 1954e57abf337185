// Checkpoint tensor naming. Three spellings are accepted for every DSV4 tensor:
//   * the official DeepSeek release names (`layers.3.attn.wq_a.weight`, `embed.weight`, ...);
//   * the same with a `model.` prefix, as transformers 5.17's save_pretrained writes them
//     (the fixture: `model.layers.3.attn.wq_a.weight`, `model.embed_tokens.weight`, `head.weight`);
//   * the HF in-memory names (`model.layers.3.self_attn.q_a_proj.weight`, `lm_head.weight`, ...).
// All are mapped to one canonical spelling, the HF in-memory name (dsv4-model.md §12.1). Routed
// experts keep a per-expert canonical name (`model.layers.L.mlp.experts.E.gate_proj.weight`);
// HF's fused `mlp.experts.gate_up_proj` / `down_proj` stay as they are. FP8 scales become
// `<weight>_scale_inv`.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dsv4 {

// Canonical name of a checkpoint tensor, or nullopt for tensors the model does not use by design
// (MTP layers, `mtp.*`). Unrecognised names are returned unchanged.
std::optional<std::string> CanonicalTensorName(std::string_view name);

}  // namespace dsv4
