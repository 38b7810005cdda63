"""genai_config.json, and the tokenizer files onnxruntime-genai loads beside the model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from builder.architecture import DecoderInfo
from builder.config_checks import token_ids
from builder.hub import TOKENIZER_FILES
from builder.io import PAST_CONV, PAST_KEY, PAST_VALUE, PRESENT_CONV, PRESENT_KEY, PRESENT_VALUE
from builder.io import PAST_RECURRENT, PRESENT_RECURRENT
from builder.target import Target

# Sampling settings taken from generation_config.json when it sets them, else these.
# ONNX Runtime's session option for the accuracy level of a DequantizeLinear + MatMul it fuses.
QDQ_ACCURACY_LEVEL = "session.qdq_matmulnbits_accuracy_level"
SEARCH_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}


def genai_config(
    info: DecoderInfo, target: Target, generation: dict[str, Any], search: dict[str, Any] | None = None,
    filename: str = "model.onnx", inputs_embeds: bool = False,
) -> dict[str, Any]:
    """The decoder's genai_config.json. generation_config.json's token ids and sampling settings
    override config.json's; the build's own `search` settings override both. `inputs_embeds`: the
    decoder reads embeddings (a multimodal package's) instead of input_ids."""
    bos, eos, pad = _special_tokens(info, generation)
    model: dict[str, Any] = {} if bos is None else {"bos_token_id": bos}  # genai rejects a null id
    return {
        "model": {
            **model,
            "context_length": info.context_length,
            "decoder": _decoder_section(info, target, filename, inputs_embeds),
            "eos_token_id": eos if len(eos) != 1 else eos[0],
            "pad_token_id": pad,
            "type": info.model_type,
            "vocab_size": info.vocab_size,
        },
        # ONNX's Attention returns past ‖ new; an int8 cache is shared only on CUDA (as genai's builder)
        "search": _search_section(info, generation, search, share_buffer=not target.standard_ops and (
            target.kv_cache is None or target.execution_provider == "cuda")),
    }


def _special_tokens(info: DecoderInfo, generation: dict[str, Any]) -> tuple[int | None, list[int], int]:
    """(bos id or None, eos ids, pad id): generation_config.json's where it sets them, else
    config.json's; without a pad id, the first eos id pads (0 without one either)."""
    bos = generation.get("bos_token_id", info.bos_token_id)
    eos = token_ids(generation.get("eos_token_id")) or info.eos_token_ids
    pad = generation.get("pad_token_id", info.pad_token_id)
    if pad is None:
        pad = eos[0] if eos else 0
    if isinstance(pad, list):
        pad = pad[0]
    return bos, eos, pad


def _decoder_section(info: DecoderInfo, target: Target, filename: str, inputs_embeds: bool) -> dict[str, Any]:
    """model.decoder: the session, the file, the shapes and the names of the inputs and outputs,
    and the sliding-window cache where the build writes one."""
    decoder: dict[str, Any] = {
        "session_options": session_options(target),
        "filename": filename,
        "head_size": info.head_size,
        "hidden_size": info.hidden_size,
        "inputs": {
            **({"inputs_embeds": "inputs_embeds"} if inputs_embeds else {"input_ids": "input_ids"}),
            "attention_mask": "attention_mask",
            **({"position_ids": "position_ids"} if target.provider.position_ids else {}),
            "past_key_names": PAST_KEY,
            "past_value_names": PAST_VALUE,
        },
        "outputs": {"logits": "logits", "present_key_names": PRESENT_KEY, "present_value_names": PRESENT_VALUE},
        "num_attention_heads": info.num_attention_heads,
        "num_hidden_layers": info.num_layers - len(info.stateless_layers),  # the layers that carry state
        "num_key_value_heads": info.num_kv_heads,
    }
    if info.sliding_window_layers and target.windowed_kv_cache:
        cached = [i for i in range(info.num_layers) if i not in info.stateless_layers]
        # onnxruntime-genai allocates these layers' KV window-long; GroupQueryAttention
        # (sliding_window_cache=1) writes them as ring buffers.
        decoder["sliding_window"] = {
            "window_size": info.sliding_window,
            "slide_key_value_cache": False,
            "slide_inputs": False,
            # numbered as the caches are: layers without one (Gemma 4's KV-sharing layers) skipped
            "layers": [n for n, layer in enumerate(cached) if layer in info.sliding_window_layers],
            "cache_slack": 0,
        }
    if any(s.conv is not None for s in info.layers):
        _declare_conv_state(decoder, info)
    return decoder


def session_options(target: Target) -> dict[str, Any]:
    """A session's options: the provider's, and the accuracy level ONNX Runtime gives the
    MatMulNBits it fuses a QDQ weight into (its session option, 4 when unset, not the build's)."""
    options: dict[str, Any] = {"log_id": "onnxruntime-genai", "provider_options": target.provider.provider_options()}
    q = target.quantization
    if q is not None and q.qdq:
        # genai passes a string-valued key it does not know to SessionOptions::AddConfigEntry (config.cpp)
        options[QDQ_ACCURACY_LEVEL] = str(q.accuracy_level)
    return options


def config_entries(options: dict[str, Any]) -> dict[str, str]:
    """The ONNX Runtime config entries among a genai_config.json session_options (`session.*` keys)."""
    return {k: v for k, v in options.items() if k.startswith("session.") and isinstance(v, str)}


def _declare_conv_state(decoder: dict[str, Any], info: DecoderInfo) -> None:
    """A hybrid decoder's convolution states, as onnxruntime-genai 0.18 reads them (its builder's
    lfm2.py and base.py): past/present_conv_names beside the KV names (genai feeds zeros of the
    inputs' shape first, then each present back), the layer types (which layers have KV, which a
    conv state; the lfm2 type requires them) and the state's length. A layer with both (Falcon-H1's)
    is declared "full_attention": genai allocates KV by that type and finds the conv and recurrent
    states of every layer by name. All from the layers' declarations (builder.state)."""
    decoder["inputs"]["past_conv_names"] = PAST_CONV
    decoder["outputs"]["present_conv_names"] = PRESENT_CONV
    decoder["layer_types"] = [s.kind for s in info.layers if not s.stateless]
    decoder["conv_cache_size"] = next(s.conv.length for s in info.layers if s.conv is not None)
    if any(s.recurrent is not None for s in info.layers):  # linear attention (Qwen3.5): as genai's base.py
        decoder["inputs"]["past_recurrent_names"] = PAST_RECURRENT
        decoder["outputs"]["present_recurrent_names"] = PRESENT_RECURRENT


def _search_section(info: DecoderInfo, generation: dict[str, Any], search: dict[str, Any] | None,
                    share_buffer: bool = True) -> dict[str, Any]:
    """search: one beam, up to the context length, with the sampling settings of
    generation_config.json (SEARCH_DEFAULTS where it has none), then the build's own `search`."""
    sampling = {k: generation[k] if generation.get(k) is not None else v for k, v in SEARCH_DEFAULTS.items()}
    return {
        "diversity_penalty": 0.0,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": info.context_length,
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        # GroupQueryAttention reads and writes the KV cache in place in one max-length buffer;
        # ONNX's Attention (a standard-ops model) returns past ‖ new, a buffer of its own.
        "past_present_share_buffer": share_buffer,
        **sampling,
        **(search or {}),
    }


def write_genai_files(source: Path, dest: Path, config: dict[str, Any]) -> list[str]:
    """Writes genai_config.json and copies the tokenizer files that exist; returns the copied names."""
    (dest / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            copy_content(source / name, dest / name)
            copied.append(name)
    return copied


def copy_content(source: Path, dest: Path) -> None:
    """Copies the bytes of `source` into a new file `dest` that others can read no more than the
    source: created with its group and other permission bits (the owner's read and write always),
    the umask applying as to any new file. shutil.copyfile creates 0666 less the umask, so a private
    (0600) file became 0644."""
    mode = os.stat(source).st_mode & 0o066 | 0o600
    with open(source, "rb") as src, open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as out:
        shutil.copyfileobj(src, out)
