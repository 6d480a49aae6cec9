"""Finding presets: a path, or a name from the project's presets/ folder."""

from __future__ import annotations

import os
from pathlib import Path

from gputui.core import safeio
from gputui.core.config import ConfigError
from gputui.core.config import load_preset
from gputui.core.usercode import code_named

# presets/ sits beside the package in the repository (and in an editable install).
PACKAGE_PRESETS = Path(__file__).resolve().parents[2] / "presets"


def user_presets_dir() -> Path:
    """Where a user's own presets are written (the app's Save as preset, `gputui tune`), the
    first folder names are looked up in (so a preset saved there runs as `gputui run NAME`);
    it may not exist yet. $GPUTUI_PRESETS_DIR when set; else ./presets, unless that is the
    project's own presets/ (gputui run from its repository), whose files are the project's:
    then $XDG_CONFIG_HOME/gputui/presets (~/.config/gputui/presets)."""
    if os.environ.get("GPUTUI_PRESETS_DIR"):
        return Path(os.environ["GPUTUI_PRESETS_DIR"])
    here = Path("presets")
    try:
        ours = here.resolve() == PACKAGE_PRESETS.resolve()
    except OSError:
        ours = False
    if not ours:
        return here
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gputui" / "presets"


def preset_dirs() -> list[Path]:
    """Folders searched for preset names: the user's (:func:`user_presets_dir`), ./presets,
    then the project's presets/."""
    dirs = [Path.cwd() / user_presets_dir(), Path.cwd() / "presets", PACKAGE_PRESETS]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def list_presets() -> list[Path]:
    """Every preset file found, by name (the first folder wins on a clash). Names only: a
    listed path may still be unreadable (see :func:`preset_problem`)."""
    seen: dict[str, Path] = {}
    for d in preset_dirs():
        try:
            names = sorted(os.listdir(d))
        except OSError:  # a presets folder that cannot be listed offers no names
            continue
        for name in names:
            if name.endswith(".toml") and not name.startswith("."):
                seen.setdefault(name[:-len(".toml")], d / name)
    return [seen[k] for k in sorted(seen)]


def preset_text(path: Path) -> str:
    """A preset's text: a regular file within safeio's bound, never blocking; OSError (an
    ``Unreadable`` for the wrong kind of file) or UnicodeDecodeError otherwise."""
    return safeio.read_text(path)


def preset_description(path: Path) -> list[str]:
    """The comment lines at the top of a preset, whole, without their ``#`` (commands keep
    their indentation). Raises OSError when the file cannot be read (see preset_text)."""
    lines = []
    for line in safeio.read_text(path, errors="replace").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return lines


def preset_problem(path: Path) -> str | None:
    """Why this preset cannot be loaded (one line, without the path), or None when it loads.
    The preset is read and checked as data (nothing runs; devices are not resolved)."""
    try:
        load_preset(path)
    except ConfigError as exc:
        return str(exc).removeprefix(f"{path}: ")
    return None


def resolve_preset(name_or_path: str) -> Path:
    """A preset path from a path or a bare name ("quickstart"); ConfigError when neither."""
    if not name_or_path.strip():
        raise ConfigError("an empty preset name: give a preset file or a name from "
                          "`gputui presets`")
    path = Path(name_or_path).expanduser()
    # a file of the wrong kind (or a dangling link) is found here and refused by load_preset
    if os.path.isfile(path) or (path.suffix == ".toml" and os.path.lexists(path)):
        return path
    if path.suffix == "" and "/" not in name_or_path:
        for d in preset_dirs():
            candidate = d / f"{name_or_path}.toml"
            if os.path.lexists(candidate):
                return candidate
    names = ", ".join(p.stem for p in list_presets()) or "none found"
    try:  # there, but not a file: say what it is (a folder, a device), not "no such preset"
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        mode = None
    if mode is not None:
        raise ConfigError(f"{name_or_path}: is {safeio.kind_of(mode)}, not a preset file; give "
                          f"a .toml file or a preset name ({names})")
    raise ConfigError(f"{name_or_path}: no such preset file or preset name; known presets: "
                      f"{names}")


def names_code(path: Path) -> list[str]:
    """``key = spec`` for each factory the preset file names (read as data; nothing runs)."""
    try:
        data = safeio.parse_toml(safeio.read_text(path))
    except (OSError, UnicodeDecodeError, ValueError):
        return []
    tables = {t: v if isinstance(v, dict) else {} for t, v in data.items()}
    return code_named({"model": tables.get("model", {}), "data": tables.get("data", {})})
