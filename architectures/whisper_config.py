"""Whisper's config.json (transformers' WhisperConfig keys and defaults), shared by its encoder
(architectures/whisper_encoder.py) and its decoder and package (architectures/whisper.py)."""

from __future__ import annotations

from dataclasses import dataclass

from builder.blocks.mlp import ACTIVATIONS
from builder.state import KV, LayerState

MODEL_TYPE = "whisper"  # onnxruntime-genai's
# onnxruntime-genai 0.18 always feeds 3000 frames (30 s of 10 ms hops) and sizes the encoder's
# output for 1500 (src/models/whisper.h: num_frames_).
FRAMES = 3000


@dataclass(frozen=True)
class WhisperConfig:
    """config.json's keys (WhisperConfig's defaults), and the names DecoderInfo reads for the text
    decoder as properties. config.json's own `num_hidden_layers` is WhisperConfig's alias of
    encoder_layers; the decoder's count is decoder_layers."""

    vocab_size: int = 51865
    num_mel_bins: int = 80
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    encoder_ffn_dim: int = 1536
    activation_function: str = "gelu"
    d_model: int = 384
    max_source_positions: int = 1500
    max_target_positions: int = 448
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 50256
    eos_token_id: int | list[int] | None = 50256
    pad_token_id: int | None = 50256
    decoder_start_token_id: int = 50257

    def __post_init__(self) -> None:
        for heads in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, heads):
                raise ValueError(f"d_model {self.d_model} is not a multiple of {heads} {getattr(self, heads)}")
        if self.max_source_positions * 2 != FRAMES:
            raise ValueError(f"max_source_positions is {self.max_source_positions}, but onnxruntime-genai feeds "
                             f"Whisper {FRAMES} frames, {FRAMES // 2} positions")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(f"activation_function {self.activation_function!r}; supported: {', '.join(ACTIVATIONS)}")

    # The text decoder, as DecoderInfo (builder.architecture.decoder_info) reads every family's.
    model_type = property(lambda self: MODEL_TYPE)
    num_hidden_layers = property(lambda self: self.decoder_layers)
    hidden_size = property(lambda self: self.d_model)
    num_attention_heads = property(lambda self: self.decoder_attention_heads)
    num_key_value_heads = property(lambda self: self.decoder_attention_heads)
    head_dim = property(lambda self: self.d_model // self.decoder_attention_heads)
    encoder_head_dim = property(lambda self: self.d_model // self.encoder_attention_heads)

    @property
    def max_position_embeddings(self) -> int:
        return self.max_target_positions

    def window(self, layer: int) -> None:
        return None

    def layer_state(self, layer: int) -> LayerState:
        """The decoder's self-attention cache (its cross-attention K/V come from the encoder)."""
        return LayerState(kv=KV(self.decoder_attention_heads, self.head_dim))
