import os

import pytest

from aieng.errors import ModelNotFoundError, VerificationError
from aieng.store import ModelRef


@pytest.fixture
def registered(store, tiny_llama):
    store.register(tiny_llama, "tiny", "1")
    return store.version_dir("tiny", "1")


def flip_one_byte(path, offset=-1):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_verify_names_a_tampered_file(store, registered):
    flip_one_byte(registered / "model.safetensors")
    report = store.verify(ModelRef("tiny", "1"))
    assert not report.ok
    assert report.problems == ["mismatched: model.safetensors (sha256 differs from manifest)"]
    with pytest.raises(VerificationError, match="model.safetensors"):
        store.verify_or_raise(ModelRef("tiny", "1"))


def test_verify_names_missing_and_extra_files(store, registered):
    (registered / "generation_config.json").unlink()
    (registered / "injected.py").write_text("print('hi')")
    problems = store.verify(ModelRef("tiny", "1")).problems
    assert "missing: generation_config.json" in problems
    assert "extra: injected.py" in problems


def test_verify_flags_symlinks(store, registered, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("x")
    os.symlink(target, registered / "link")
    assert any("symlink" in p for p in store.verify(ModelRef("tiny", "1")).problems)


def test_verify_current_resolves_the_pointer(store, registered):
    store.promote("tiny", "1")
    assert store.verify(ModelRef("tiny")).version == "1"


def test_unknown_model_or_version_is_a_clear_error(store, registered):
    with pytest.raises(ModelNotFoundError, match="not in the store"):
        store.verify(ModelRef("nope"))
    with pytest.raises(ModelNotFoundError, match="versions of tiny: 1"):
        store.verify(ModelRef("tiny", "9"))
    with pytest.raises(ModelNotFoundError, match="no current version"):
        store.verify(ModelRef("tiny"))
