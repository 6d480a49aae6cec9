"""Errors meant for the user (``gputui.core.errors``): shown as they are, everything else with
its type; the first line only, whatever the message holds."""

from __future__ import annotations

import pytest

from gputui.core.config import ConfigError
from gputui.core.devices import DeviceSpecError
from gputui.core.errors import UserError, describe, fault_line, first_line
from gputui.core.filewrite import WriteFailed


def test_a_users_error_is_its_first_line_and_a_fault_names_its_type():
    assert describe(DeviceSpecError("--devices: 'x' is not a device\nmore")) == (
        "--devices: 'x' is not a device")
    assert describe(ValueError("\n  bad x\n detail")) == "ValueError: bad x"
    assert describe(RuntimeError("")) == "RuntimeError"
    assert fault_line(ConfigError("bad")) == "ConfigError: bad"
    assert first_line("\n\n  two\nthree") == "two" and first_line("") == ""


@pytest.mark.parametrize("exc", [ConfigError("x"), DeviceSpecError("x"),
                                 WriteFailed("/nowhere/f", PermissionError(13, "denied"))])
def test_errors_for_the_user_keep_their_other_base(exc):
    assert isinstance(exc, UserError)
    assert isinstance(exc, (ValueError, OSError))  # callers that catch those still do


def test_the_training_sides_errors_for_the_user_share_the_base():
    from gputui.train.checkpoint import CheckpointError
    from gputui.train.dataset import DataError
    from gputui.train.guards import Diverged, OutOfMemory
    from gputui.train.strategies.fastpath import CompileError
    from gputui.train.strategies.scratch import ReplicaMismatch
    from gputui.train.userfactory import UserCodeError

    for cls in (CheckpointError, DataError, Diverged, OutOfMemory, CompileError,
                ReplicaMismatch, UserCodeError):
        assert issubclass(cls, UserError) and issubclass(cls, RuntimeError), cls
        assert describe(cls("one line\ntraceback")) == "one line"


def test_the_backend_rule_is_one_function():
    from gputui.core.devices import backend_for

    assert [backend_for("auto", "cuda"), backend_for("auto", "cpu"),
            backend_for("gloo", "cuda"), backend_for("nccl", "cpu")] == [
        "nccl", "gloo", "gloo", "nccl"]
