"""A PEFT LoRA adapter merged into the base checkpoint's weights inside the lazy tensors.

PEFT saves an adapter as adapter_config.json and adapter_model.safetensors, whose tensors are named
after the modules of the transformers model it was trained on (peft's get_peft_model_state_dict):
`base_model.model.<module>.lora_A.weight` A [r, in] and `.lora_B.weight` B [out, r] for a Linear,
`.lora_embedding_A` [r, vocab] and `.lora_embedding_B` [dim, r] for an Embedding, and
`base_model.model.<module>.weight` for a module in `modules_to_save` (a full replacement).

`LoraCheckpoint` wraps the base checkpoint: `weight("<module>.weight")` yields a recipe that, at
write time, computes W + s·(B @ A) in float32 (transposed for an Embedding or a `fan_in_fan_out`
Conv1D, as peft's get_delta_weight does), one matrix at a time, so architectures need no change and
a quantized build rounds the merged weight. s is lora_alpha / r (lora_alpha / √r with use_rslora),
r being each module's own rank (A's rows), which is how peft applies a rank_pattern.

A merged weight keeps the base tensor's dtype, as in peft's merged model: merge_and_unload adds the
float32 delta into the base weight in place, so a bf16 or fp16 base's merged weight is W + s·B·A
rounded once to bf16 or fp16 (an Embedding's delta is rounded to it before the add, as peft's
Embedding.merge does), and a modules_to_save replacement is loaded into the base's dtype too. So
merged and untouched weights share one dtype (peft's default Llama targets, q and v only, fuse with
the untouched k), and every precision is built from the very weights peft's merged model holds.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from builder import hub
from builder.errors import BuildError
from builder.hf_config import load_json
from builder.inputs.mapping import mapped
from builder.inputs.safetensors import DTYPES, SafetensorsCheckpoint, read_header
from builder.inputs.source import Checkpoint
from builder.inputs.trust import check_folder
from builder.lazy import Weight

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "Adapter", "LoraCheckpoint", "adapter_folder", "with_adapter"]

log = logging.getLogger("builder")

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
# adapter_config.json keys that change nothing in a merged inference model (training and
# initialization settings, bookkeeping), and those builder reads.
_HARMLESS = {
    "task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
    "inference_mode", "r", "target_modules", "exclude_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out",
    "bias", "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform", "layers_pattern",
    "rank_pattern", "eva_config", "corda_config", "lora_ga_config", "runtime_config", "megatron_core",
    "qalora_group_size", "ensure_weight_tying", "use_dora",
}
# The rest change what the adapter computes; each is refused, when set, with the reason.
_REFUSED = {
    "use_dora": "DoRA (use_dora) rescales each merged column by a learned magnitude; builder merges plain LoRA only",
    "alpha_pattern": "per-module lora_alpha (alpha_pattern) is not supported",
    "lora_bias": "LoRA biases (lora_bias) are not supported",
    "trainable_token_indices": "trainable token rows (trainable_token_indices) are not supported",
    "target_parameters": "LoRA on bare parameters (target_parameters, mixture-of-experts weights) is not supported",
    "layer_replication": "layer replication (layer_replication) is not supported",
    "loftq_config": "LoftQ adapters belong to a quantized base (loftq_config); builder merges into the original",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens) applies only after its invocation "
                               "tokens and cannot be merged",
    "use_qalora": "QA-LoRA (use_qalora) is not supported",
    "megatron_config": "Megatron-parallel LoRA (megatron_config) is not supported",
    "arrow_config": "Arrow routing (arrow_config) mixes adapters per token and cannot be merged",
    "use_bdlora": "block-diagonal LoRA (use_bdlora) is not supported",
    "velora_config": "VeLoRA (velora_config) is not supported",
    "monteclora_config": "MonteCLoRA (monteclora_config) is not supported",
    "kasa_config": "KaSA (kasa_config) is not supported",
}
_PAIRS = {"lora_A": ("lora_B", False), "lora_embedding_A": ("lora_embedding_B", True)}  # A -> (B, delta transposed)


@dataclass(frozen=True)
class Adapter:
    """A PEFT LoRA adapter folder, read and checked; its tensors are still unread.

    Example:
        >>> adapter = Adapter.open("path/to/adapter")                       # doctest: +SKIP
        >>> ckpt = LoraCheckpoint(SafetensorsCheckpoint.open("path/to/base"), adapter)  # doctest: +SKIP
    """

    folder: Path
    config: dict[str, Any]
    alpha: float
    rslora: bool
    fan_in_fan_out: bool
    tensors: SafetensorsCheckpoint  # the adapter's own tensors by their saved names

    @classmethod
    def open(cls, folder: str | os.PathLike) -> Adapter:
        folder = Path(folder)
        config_path, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
        if folder.is_dir():
            check_folder(folder, "adapter folder")  # before anything in it is read
        if not config_path.is_file():
            raise BuildError(f"--adapter {folder}: no {CONFIG_FILE} (a PEFT adapter folder holds it and {WEIGHTS_FILE})")
        try:
            config = load_json(config_path)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BuildError(f"{config_path}: not valid JSON ({e})") from None
        if not isinstance(config, dict):
            raise BuildError(f"{config_path}: not a JSON object")
        peft_type = config.get("peft_type", "LORA")
        if peft_type != "LORA":
            raise BuildError(f"{config_path}: peft_type {peft_type!r} is not supported; builder merges LoRA adapters only")
        for key, reason in _REFUSED.items():
            if config.get(key):
                raise BuildError(f"{config_path}: {reason}")
        if config.get("bias", "none") != "none":
            raise BuildError(f"{config_path}: bias {config['bias']!r} is not supported (trained biases); "
                             "builder merges adapters with bias 'none'")
        unknown = sorted(k for k, v in config.items() if v and k not in _HARMLESS and k not in _REFUSED)
        if unknown:
            raise BuildError(f"{config_path}: unsupported setting {unknown[0]}={config[unknown[0]]!r}; builder "
                             "merges plain LoRA")
        r, alpha = config.get("r"), config.get("lora_alpha")
        if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
            raise BuildError(f"{config_path}: r must be a positive integer, got {r!r}")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < math.inf:
            raise BuildError(f"{config_path}: lora_alpha must be a positive finite number, got {alpha!r}")
        if not weights.is_file():
            if (folder / "adapter_model.bin").is_file():
                raise BuildError(f"{folder} holds only adapter_model.bin (pickle); builder never unpickles: save the "
                                 "adapter with safe_serialization (the default) or convert it to safetensors")
            raise BuildError(f"--adapter {folder}: no {WEIGHTS_FILE}")
        return cls(folder, config, float(config["lora_alpha"]), bool(config.get("use_rslora")),
                   bool(config.get("fan_in_fan_out")), SafetensorsCheckpoint(read_header(weights)))

    def scale(self, r: int) -> float:
        """peft's LoraLayer.update_layer: lora_alpha / r, or lora_alpha / √r with rsLoRA."""
        return self.alpha / math.sqrt(r) if self.rslora else self.alpha / r

    def files(self) -> list[Path]:
        return [self.folder / CONFIG_FILE, self.folder / WEIGHTS_FILE]


_KINDS = {*_PAIRS, *(b for b, _ in _PAIRS.values())}


def _split(name: str) -> tuple[str, str | None]:
    """`base_model.model.model.layers.0.q_proj.lora_A.weight` -> ('model.layers.0.q_proj', 'lora_A');
    a full tensor (modules_to_save, or an embedding's `base_layer` saved with save_embedding_layers)
    -> (the base tensor it replaces, None)."""
    parts = name.removeprefix(PREFIX).split(".")
    for i, part in enumerate(parts):
        if part in _KINDS:
            return ".".join(parts[:i]), part
    return ".".join(p for p in parts if p != "base_layer"), None


def _partner(name: str, kind: str, other: str) -> str:
    """The name of the other half of a pair: lora_A <-> lora_B in the same module."""
    parts = name.split(".")
    return ".".join(other if p == kind else p for p in parts)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == DTYPES["BF16"]


def _check_factors(tensors: SafetensorsCheckpoint, a_name: str, b_name: str) -> None:
    """Refuses, when the adapter is opened, a pair that is not LoRA's two factors A [r, in] and
    B [out, r] with one rank r >= 1 (a merge would otherwise fail at write time, or divide by r = 0)."""
    a, b = tensors.info(a_name).shape, tensors.info(b_name).shape
    if len(a) != 2 or len(b) != 2 or b[1] != a[0] or a[0] < 1:
        raise BuildError(f"adapter tensors {a_name} {list(a)} and {b_name} {list(b)} are not LoRA factors "
                         "(A [r, in] and B [out, r], of one rank r >= 1)")


class LoraCheckpoint:
    """The base checkpoint with the adapter merged in: the same interface, other values.

    Every other attribute is the base's; `check_consumed` also fails naming each adapter tensor
    that no weight the architecture read has used.
    """

    def __init__(self, base: Checkpoint, adapter: Adapter):
        self.base = base
        self.adapter = adapter
        self.deltas: dict[str, tuple[str, str, bool]] = {}  # base weight -> (A, B, transposed)
        self.replaced: dict[str, str] = {}  # base tensor -> the adapter's full replacement
        names = set(adapter.tensors.tensors)
        for name in sorted(names):
            module, kind = _split(name)
            if not name.startswith(PREFIX):
                raise BuildError(f"adapter tensor {name!r} is not named base_model.model.<module>...; not a PEFT "
                                 "LoRA adapter")
            if kind is None:
                if module in self.replaced:
                    raise BuildError(f"adapter tensors {self.replaced[module]!r} and {name!r} both replace {module!r}")
                self.replaced[module] = name
            elif kind in _PAIRS:
                partner_kind, transposed = _PAIRS[kind]
                partner = _partner(name, kind, partner_kind)
                if partner not in names:
                    raise BuildError(f"adapter tensor {name!r} has no {partner_kind} partner {partner!r}")
                _check_factors(adapter.tensors, name, partner)
                self.deltas[f"{module}.weight"] = (name, partner, transposed)
            elif _partner(name, kind, kind[:-1] + "A") not in names:
                raise BuildError(f"adapter tensor {name!r} has no {kind[:-1]}A partner")

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.base, attr)

    def __contains__(self, name: str) -> bool:
        return name in self.base

    def weight(self, name: str, shape=None, packed: bool = False) -> Weight:
        if name in self.replaced:
            self.base.consume(name)  # replaced whole (modules_to_save): the base's values are not read
            saved = self.replaced[name]
            info = self.adapter.tensors.info(saved)
            expected = self.base.info(name).shape if shape is None else tuple(shape)
            if info.shape != expected:
                raise BuildError(f"adapter tensor {saved!r} has shape {list(info.shape)} but replaces {name!r} "
                                 f"of shape {list(expected)}")
            self.adapter.tensors.weight(saved)  # marks it used (and checks it is floating point)
            # Named after the base tensor it stands for, so layer patterns and records see that name.
            w = Weight.source(info.shape, info.dtype, lambda stack: stack.enter_context(mapped(info)), name)
            base_dtype = self.base.info(name).dtype
            if _is_float(base_dtype):  # peft loads the replacement into a copy of the base module
                w = w.astype(base_dtype)
        else:
            w = self.base.weight(name, shape, packed)
        if name not in self.deltas:
            return w
        a_name, b_name, transposed = self.deltas[name]
        a, b = self.adapter.tensors.weight(a_name), self.adapter.tensors.weight(b_name)
        r = a.shape[0]
        delta_shape = (b.shape[0], a.shape[1])
        if transposed != self.adapter.fan_in_fan_out:  # an Embedding's delta is (B A)ᵀ; so is a Conv1D's
            delta_shape = delta_shape[::-1]
        if len(w.shape) != 2 or b.shape[1] != r or delta_shape != w.shape:
            raise BuildError(f"adapter tensors {a_name} {list(a.shape)} and {b_name} {list(b.shape)} do not fit "
                             f"{name} {list(w.shape)}")
        scale = np.float32(self.adapter.scale(r))
        flip = delta_shape != (b.shape[0], a.shape[1])
        dtype = w.dtype  # the merged weight's, as in peft's merged model (module docstring)
        work = np.result_type(dtype, np.float32)  # float32, or a float64 base's own

        def make_merge():
            """The factors once per write, then each block of rows merged: W[a:b] + scale·(B A)[a:b]."""
            bf, af = b.numpy().astype(np.float32), a.numpy().astype(np.float32)  # (N, r), (r, K): rank-sized

            def merge(base: np.ndarray, start: int, stop: int) -> np.ndarray:
                # Rows [start, stop) of the delta: B[start:stop] A, or of (B A)ᵀ: (B A[:, start:stop])ᵀ.
                delta = (bf @ af[:, start:stop]).T if flip else bf[start:stop] @ af
                delta *= scale
                if transposed:  # peft's Embedding.merge rounds the delta to the base dtype before adding it
                    delta = delta.astype(dtype).astype(work)
                out = base.astype(work)
                out += delta
                return out.astype(dtype, copy=False)  # one rounding of the sum, as peft's in-place add

            return merge

        # A block of rows at a time (the whole merge held the delta and the sum as float32 [N, K]);
        # a pre-quantized base's blocks are dropped: the merge changes them.
        return w.map_rows(make_merge, dtype)

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        changed = set(self.deltas) | set(self.replaced)
        if a in changed or b in changed:
            return False  # at most one of them is changed by the adapter, or two differently
        return self.base.same_values(a, b, rows_per_chunk)

    def check_consumed(self, ignore=()) -> None:
        self.base.check_consumed(ignore)
        left = self.adapter.tensors.unconsumed()
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise BuildError(f"adapter tensors that match no weight of the base model this architecture reads: {shown}")


class AdapterOptions(Protocol):
    """What of a build's options finds the adapter (builder.options.BuildOptions has them): the
    input formats stand below the options, and read only these."""

    @property
    def adapter(self) -> str | None: ...  # --adapter: a folder or a Hugging Face id
    @property
    def model(self) -> str | None: ...
    @property
    def input(self) -> str | None: ...
    @property
    def cache_dir(self) -> str | None: ...


def with_adapter(checkpoint: Checkpoint, options: AdapterOptions) -> tuple[Checkpoint, Adapter | None]:
    """Any source's checkpoint with the --adapter merged in (and the adapter), or as it is without
    one. Opened after the base's headers: a broken base is refused before an adapter is fetched."""
    if options.adapter is None:
        return checkpoint, None
    adapter = Adapter.open(adapter_folder(options))
    trained_on = str(adapter.config.get("base_model_name_or_path") or "")
    given = options.model or str(options.input)
    if trained_on and Path(trained_on.rstrip("/")).name != Path(given.rstrip("/")).name:
        log.warning("the adapter was trained on %s, not %s; building anyway", trained_on, given)
    return LoraCheckpoint(checkpoint, adapter), adapter


def adapter_folder(options: AdapterOptions) -> Path | None:
    """The local folder of --adapter (the folder itself, or its hub snapshot), None without one."""
    if options.adapter is None:
        return None
    return hub.resolve(options.adapter, None, options.cache_dir, hub.ADAPTER_PATTERNS)
