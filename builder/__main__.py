import sys
from pathlib import Path


def _ignore_current_folder() -> None:
    """`python -m` puts the current folder first on sys.path, so a folder there named `builder` or
    `architectures` (the parent of a clone, any other project) shadows ours: drop that entry, and
    what was imported from it, unless the current folder is this project's own root."""
    root = Path(__file__).resolve().parent.parent
    cwd = Path.cwd().resolve()
    if cwd == root:
        return
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != cwd]
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in ("builder", "architectures") and name != "__main__":
            files = [getattr(module, "__file__", None), *getattr(module, "__path__", [])]
            if not any(f and root in Path(f).resolve().parents for f in files):
                del sys.modules[name]


_ignore_current_folder()

from builder.cli import main  # noqa: E402

sys.exit(main())
