"""staged_directory: the folder appears complete under its name, or not at all."""

import contextlib
import os

import pytest

from aieng.store.staging import occupied, staged_directory


class Taken(Exception):
    pass


def _taken(target):
    return Taken(f"{target.name} is taken")


def _siblings(parent, target_name):
    return sorted(p.name for p in parent.iterdir() if p.name != target_name)


def test_success_publishes_the_folder_and_leaves_no_temp(tmp_path):
    target = tmp_path / "deep" / "model"
    with staged_directory(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".model.tmp-")
        assert list(tmp.iterdir()) == []
        (tmp / "weights").write_text("w")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x").write_text("x")
        assert not target.exists()  # nothing visible until the block ends
    assert (target / "weights").read_text() == "w"
    assert (target / "sub" / "x").read_text() == "x"
    assert _siblings(target.parent, "model") == []


def test_the_temp_folder_takes_the_given_name(tmp_path):
    with staged_directory(tmp_path / "model", tmp_name=".model.building-host-1-abc") as tmp:
        assert tmp == tmp_path / ".model.building-host-1-abc"
    assert (tmp_path / "model").is_dir()


@pytest.mark.parametrize("error", [RuntimeError("crash"), KeyboardInterrupt(), SystemExit(143)])
def test_an_exception_leaves_no_temp_folder_and_no_target(tmp_path, error):
    target = tmp_path / "model"
    with pytest.raises(type(error)):
        with staged_directory(target) as tmp:
            (tmp / "half-written").write_text("x")
            raise error
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_non_empty_target_is_refused_before_any_work_and_left_untouched(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    entered = False
    with pytest.raises(Taken, match="model is taken"):
        with staged_directory(target, exists_error=_taken):
            entered = True
    assert not entered
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "mine"
    assert _siblings(tmp_path, "model") == []


def test_a_target_created_while_working_is_refused_at_the_rename(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(Taken):
        with staged_directory(target, exists_error=_taken) as tmp:
            (tmp / "ours").write_text("ours")
            target.mkdir()
            (target / "theirs").write_text("theirs")  # a concurrent writer won
    assert [p.name for p in target.iterdir()] == ["theirs"]
    assert _siblings(tmp_path, "model") == []


def test_a_plain_file_or_a_symlink_at_the_target_is_refused(tmp_path):
    file_target = tmp_path / "file"
    file_target.write_text("x")
    with pytest.raises(FileExistsError, match="already exists"):
        with staged_directory(file_target):
            pass
    empty = tmp_path / "empty"
    empty.mkdir()
    link = tmp_path / "link"
    link.symlink_to(empty)
    with pytest.raises(FileExistsError):
        with staged_directory(link):
            pass
    assert link.is_symlink() and list(empty.iterdir()) == []


def test_an_empty_target_dir_is_replaced(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    with staged_directory(target) as tmp:
        (tmp / "weights").write_text("w")
    assert [p.name for p in target.iterdir()] == ["weights"]
    assert _siblings(tmp_path, "model") == []


def test_replace_empty_false_refuses_even_an_empty_target(tmp_path):
    target = tmp_path / "v1"
    target.mkdir()
    with pytest.raises(Taken):
        with staged_directory(target, exists_error=_taken, replace_empty=False):
            pass
    assert target.is_dir() and list(target.iterdir()) == []
    assert occupied(target, replace_empty=False) and not occupied(target)


def test_the_lock_is_held_around_the_final_check_and_rename_only(tmp_path):
    target = tmp_path / "model"
    events = []

    @contextlib.contextmanager
    def lock():
        events.append(("enter", target.exists()))
        yield
        events.append(("exit", target.exists()))

    with staged_directory(target, lock=lock()) as tmp:
        events.append(("body", target.exists()))
        (tmp / "w").write_text("w")
    assert events == [("body", False), ("enter", False), ("exit", True)]


def test_a_failed_body_never_takes_the_lock(tmp_path):
    taken = []

    @contextlib.contextmanager
    def lock():
        taken.append(True)
        yield

    with pytest.raises(RuntimeError):
        with staged_directory(tmp_path / "model", lock=lock()):
            raise RuntimeError("crash")
    assert taken == []


def test_a_failed_rename_cleans_up(tmp_path, monkeypatch):
    import aieng.store.staging as staging

    def fail(src, dst):
        raise OSError("rename failed (injected)")

    monkeypatch.setattr(staging.os, "rename", fail)
    with pytest.raises(OSError, match="injected"):
        with staged_directory(tmp_path / "model") as tmp:
            (tmp / "w").write_text("w")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
