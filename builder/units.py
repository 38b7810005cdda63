"""Sizes in words for messages: 1.2 GB, 340.0 MB, 512 B (decimal units, as disks are sold)."""


def human(n: float) -> str:
    """`n` bytes in decimal units: human(1_500_000) == "1.5 MB"."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"
