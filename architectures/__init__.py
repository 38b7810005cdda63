"""The one registry: Hugging Face architecture name -> the module in this package that builds it."""

from __future__ import annotations

import importlib
from types import ModuleType

from builder.errors import BuildError

__all__ = ["ALIASES", "ARCHITECTURES", "PACKAGES", "BuildError", "canonical", "load", "load_package"]

ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma",
    "Gemma3ForCausalLM": "gemma",
    "Gemma3ForConditionalGeneration": "gemma",
    "Phi3ForCausalLM": "phi3",
    "CohereForCausalLM": "cohere",
    "Cohere2ForCausalLM": "cohere",
    "GlmForCausalLM": "glm",
    "Glm4ForCausalLM": "glm",
    "PhiForCausalLM": "phi",
    "StableLmForCausalLM": "stablelm",
    "Starcoder2ForCausalLM": "starcoder2",
    "NemotronForCausalLM": "nemotron",
    "OlmoForCausalLM": "olmo",
    "Olmo2ForCausalLM": "olmo",
    "Olmo3ForCausalLM": "olmo",
    "Exaone4ForCausalLM": "exaone4",
    "HunYuanDenseV1ForCausalLM": "hunyuan",
    "MinistralForCausalLM": "ministral",
    "Ministral3ForCausalLM": "ministral",
    "SeedOssForCausalLM": "llama",
    "Ernie4_5ForCausalLM": "llama",
    "GraniteForCausalLM": "granite",
    "GraniteMoeForCausalLM": "granite",
    "SmolLM3ForCausalLM": "smollm3",
    "GptOssForCausalLM": "gpt_oss",
    "Qwen2MoeForCausalLM": "moe",
    "Qwen3MoeForCausalLM": "moe",
    "MixtralForCausalLM": "moe",
    "OlmoeForCausalLM": "moe",
    "PhimoeForCausalLM": "phimoe",
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
}

# Hub spellings of a class that transformers knows by another name (the checkpoint's model_type
# selects transformers' own class): microsoft/Phi-3.5-MoE-instruct's config.json says PhiMoE.
ALIASES: dict[str, str] = {
    "PhiMoEForCausalLM": "PhimoeForCausalLM",
}


def canonical(architecture: str) -> str:
    return ALIASES.get(architecture, architecture)


# Architectures whose checkpoints hold more than a decoder: the module that builds the rest (its
# package(raw, folder, checkpoint, config, target) returns the other models, or None).
PACKAGES: dict[str, str] = {
    "Gemma3ForConditionalGeneration": "gemma3_multimodal",
}


def load_package(architecture: str) -> ModuleType | None:
    return importlib.import_module(f"architectures.{PACKAGES[architecture]}") if architecture in PACKAGES else None


def load(architecture: str) -> ModuleType:
    """The module for `architecture`; an unknown name fails listing the supported ones."""
    if architecture not in ARCHITECTURES:
        raise BuildError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    module = importlib.import_module(f"architectures.{ARCHITECTURES[architecture]}")
    if architecture not in module.VARIANTS:
        raise BuildError(f"the registry sends {architecture} to architectures/{ARCHITECTURES[architecture]}.py, "
                         "which does not define it (no VARIANTS row)")
    return module
