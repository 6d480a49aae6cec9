"""`predict` with a folder it cannot write ends in one line and exit 2, never a traceback."""

from __future__ import annotations

import pytest

from gputui.core.filewrite import WriteFailed, make_folder
from gputui.runs.predict.cache import Cache


def test_a_cache_folder_that_is_a_file_is_one_line(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("")
    cache = Cache(blocker / "gputui" / "predict-x.json")
    with pytest.raises(WriteFailed) as info:
        cache.put("k", {"v": 1})
    assert "XDG_CACHE_HOME" in str(info.value) and "\n" not in str(info.value)


def test_make_folder_blames_the_folder(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(WriteFailed, match="Not a directory"):
        make_folder(tmp_path / "f" / "sub")
