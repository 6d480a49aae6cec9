"""Finding presets: a path, or a name from the project's presets/ folder."""

from __future__ import annotations

from pathlib import Path

from gputui.config import ConfigError

# presets/ sits beside the package in the repository (and in an editable install).
PACKAGE_PRESETS = Path(__file__).resolve().parent.parent / "presets"


def preset_dirs() -> list[Path]:
    """Folders searched for preset names: ./presets, then the project's presets/."""
    dirs = [Path.cwd() / "presets", PACKAGE_PRESETS]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def list_presets() -> list[Path]:
    """Every preset file found, by name (the first folder wins on a clash)."""
    seen: dict[str, Path] = {}
    for d in preset_dirs():
        for p in sorted(d.glob("*.toml")):
            seen.setdefault(p.stem, p)
    return [seen[k] for k in sorted(seen)]


def preset_description(path: Path) -> list[str]:
    """The comment lines at the top of a preset, whole, without their ``#`` (commands keep
    their indentation)."""
    lines = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return lines


def resolve_preset(name_or_path: str) -> Path:
    """A preset path from a path or a bare name ("quickstart"); ConfigError when neither."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.suffix == "" and "/" not in name_or_path:
        for d in preset_dirs():
            candidate = d / f"{name_or_path}.toml"
            if candidate.is_file():
                return candidate
    names = ", ".join(p.stem for p in list_presets()) or "none found"
    raise ConfigError(f"{name_or_path}: no such preset file or preset name; known presets: "
                      f"{names}")


def names_code(path: Path) -> list[str]:
    """``key = spec`` for each factory the preset file names (read as data; nothing runs)."""
    import tomllib

    from gputui.usercode import code_named

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    tables = {t: v if isinstance(v, dict) else {} for t, v in data.items()}
    return code_named({"model": tables.get("model", {}), "data": tables.get("data", {})})
