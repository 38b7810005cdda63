"""A model id or folder -> a local folder holding config.json, the safetensors and the tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

from builder.errors import BuildError

# The tokenizer files onnxruntime-genai (and transformers) may read beside a model: fetched from the
# hub and copied into the output.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
# Only what a build reads: never pickled *.bin weights, never other formats' duplicates.
# preprocessor_config.json: an image-and-text model's image preprocessing (builder/image_processor.py),
# Whisper's log-mel settings (builder/audio_processor.py).
ALLOW_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                  "preprocessor_config.json", *TOKENIZER_FILES]


ADAPTER_PATTERNS = ["adapter_config.json", "adapter_model.safetensors"]


def _looks_like_path(model: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else the user typed is meant as a folder."""
    return model.startswith((".", "/", "~")) or model.count("/") > 1


def _missing_folder(model: str, why: str) -> BuildError | None:
    """`examples/tiny-lama` reads as a hub id too; when its parent is a local folder the user most
    likely mistyped a path, so say that first (the hub was still tried: `org/` may be a folder too)."""
    path = Path(model).expanduser()
    if model.count("/") == 1 and path.parent.is_dir():
        return BuildError(f"no such folder {model} (and {why})" + _did_you_mean(path))
    return None


def _did_you_mean(path: Path, suffix: str | None = None) -> str:
    """The closest folder beside `path` (or file ending in `suffix`), as a hint."""
    if not path.parent.is_dir():
        return ""
    import difflib

    names = [p.name for p in path.parent.iterdir() if (p.is_file() and p.suffix == suffix if suffix else p.is_dir())]
    close = difflib.get_close_matches(path.name, names, n=1)
    return f"; did you mean {path.parent / close[0]}?" if close else ""


def resolve(model: str, revision: str | None = None, cache_dir: str | None = None,
            allow_patterns: list[str] = ALLOW_PATTERNS) -> Path:
    """Returns a local folder for `model`: the folder itself, or the hub snapshot (cached or downloaded).

    Honors the Hugging Face cache (HF_HOME / HF_HUB_CACHE, or `cache_dir`) and HF_HUB_OFFLINE=1.
    """
    path = Path(model).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return path
    if path.exists():
        raise BuildError(f"{model} is a file; --model takes a folder, a .gguf file or a Hugging Face id")
    if path.suffix == ".gguf":  # a GGUF checkpoint is a local file; hub ids name repositories
        raise BuildError(f"{model}: no such file" + _did_you_mean(path, ".gguf"))
    if _looks_like_path(model):
        raise BuildError(f"{model}: no such folder" + _did_you_mean(path))
    # Imported here: huggingface_hub costs start-up time that local builds need not pay.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(model, revision=revision, allow_patterns=allow_patterns,
                                     cache_dir=None if cache_dir is None else Path(cache_dir).expanduser()))
    except HFValidationError:
        raise _missing_folder(model, "not a valid Hugging Face id") or BuildError(
            f"{model}: no such folder, and not a valid Hugging Face id") from None
    except GatedRepoError:
        raise BuildError(f"{model} is gated on the Hugging Face hub: accept its license and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise _missing_folder(model, "no such model on the Hugging Face hub") or BuildError(
            f"{model}: no such folder, and no such model on the Hugging Face hub") from None
    except RevisionNotFoundError:
        raise BuildError(f"{model}: revision {revision!r} not found on the Hugging Face hub") from None
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise _missing_folder(model, f"not in the Hugging Face cache; {why}") or BuildError(
            f"{model} is not in the Hugging Face cache and {why}") from None
    except OSError as e:
        raise BuildError(f"{model}: download failed ({e})") from None
