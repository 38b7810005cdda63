"""A build reads nothing outside the model folder (or the adapter folder) it was given.

Folders are often downloaded from strangers, and any of their files may be a symlink: a
`tokenizer.json` pointing at `~/.ssh/id_rsa` would otherwise be read, hashed into build.yaml and
copied into the output. So before anything is read, every file of the folder a build may read
(each entry not hidden: the pipeline hashes them all) must resolve, through however many links,
inside the folder itself, or, when the folder is a Hugging Face cache snapshot
(`<cache>/models--org--name/snapshots/<rev>/`), inside that repository's `blobs/` folder, where the
hub keeps the files its snapshot links point to. The folder itself (and a `.gguf` file given
directly) may be a link: that is the user's own choice.
"""

from __future__ import annotations

import os
from pathlib import Path

from builder.errors import BuildError


def allowed_roots(folder: Path) -> tuple[Path, ...]:
    """Where the files of `folder` may resolve: the folder, and a hub snapshot's blob store."""
    root = Path(os.path.realpath(folder))
    snapshots, repo = root.parent, root.parent.parent
    if snapshots.name == "snapshots" and repo.name.startswith("models--"):
        return root, repo / "blobs"
    return (root,)


def _inside(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def check_folder(folder: Path, what: str = "model folder") -> None:
    """Refuses, in one line, a file of `folder` that is a link resolving outside it (a chain of
    links is judged by its final target). Links to folders are not followed: nothing is read
    through them (an index naming a file in one is refused by `safetensors.safetensors_files`)."""
    roots = allowed_roots(folder)
    try:
        entries = sorted(folder.iterdir())
    except OSError as e:
        raise BuildError(f"{folder}: cannot list the {what} ({e.strerror or e})") from None
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_symlink():
            continue
        target = Path(os.path.realpath(entry))
        if target.is_dir() or _inside(target, roots):
            continue
        where = " or its Hugging Face cache blobs" if len(roots) > 1 else ""
        raise BuildError(f"{entry} is a link to {target}, outside the {what}{where}; builder reads nothing "
                         "outside it (copy the file in instead)")
