"""Weights reach the node once: the sync is a no-op when the cache is verified, repairs
what is missing or torn, and the engine refuses a tokenizer that disagrees with config.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runtime import weights as wt


class CountingStore(wt.DirStore):
    def __init__(self, root: Path):
        super().__init__(root)
        self.fetches: list[str] = []

    def fetch(self, key: str, dest: Path) -> None:
        self.fetches.append(key)
        super().fetch(key, dest)


@pytest.fixture()
def bucket(tmp_path, tiny_deepseek_v2) -> Path:
    """The model prefix as it sits in the bucket."""
    src = tmp_path / "bucket" / "models" / "tiny"
    shutil.copytree(tiny_deepseek_v2, src)
    return src


def test_first_sync_copies_everything(bucket, tmp_path):
    store = CountingStore(bucket)
    dest = tmp_path / "cache"
    fetched = wt.sync(store, dest, log=lambda *_: None)
    files = sorted(str(p.relative_to(bucket)) for p in bucket.rglob("*") if p.is_file())
    assert sorted(fetched) == files
    for f in files:
        assert (dest / f).read_bytes() == (bucket / f).read_bytes()
    manifest = json.loads((dest / wt.MANIFEST).read_text())
    assert set(manifest) == set(files)


def test_second_sync_is_a_no_op(bucket, tmp_path):
    dest = tmp_path / "cache"
    wt.sync(CountingStore(bucket), dest, log=lambda *_: None)
    mtimes = {p: p.stat().st_mtime_ns for p in dest.rglob("*.safetensors")}
    again = CountingStore(bucket)
    assert wt.sync(again, dest, log=lambda *_: None) == []
    assert again.fetches == []
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*.safetensors")} == mtimes


def test_torn_or_missing_files_are_fetched_again(bucket, tmp_path):
    dest = tmp_path / "cache"
    wt.sync(CountingStore(bucket), dest, log=lambda *_: None)
    weights = next(dest.glob("*.safetensors"))
    with open(weights, "r+b") as fh:  # a copy cut short by a node crash
        fh.truncate(10)
    (dest / "config.json").unlink()
    store = CountingStore(bucket)
    fetched = wt.sync(store, dest, log=lambda *_: None)
    assert sorted(fetched) == sorted([weights.name, "config.json"])
    assert weights.read_bytes() == (bucket / weights.name).read_bytes()


def test_a_new_remote_version_is_fetched(bucket, tmp_path):
    dest = tmp_path / "cache"
    wt.sync(CountingStore(bucket), dest, log=lambda *_: None)
    cfg = bucket / "generation_config.json"
    cfg.write_text(json.dumps({"temperature": 0.6}))
    store = CountingStore(bucket)
    assert "generation_config.json" in wt.sync(store, dest, log=lambda *_: None)
    assert json.loads((dest / "generation_config.json").read_text()) == {"temperature": 0.6}


def test_metadata_only_skips_weights(bucket, tmp_path):
    dest = tmp_path / "meta"
    fetched = wt.sync(CountingStore(bucket), dest, log=lambda *_: None, metadata_only=True)
    assert "config.json" in fetched
    assert not any(k.endswith(".safetensors") for k in fetched)


def test_empty_prefix_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(wt.WeightsError, match="empty"):
        wt.sync(wt.DirStore(tmp_path / "empty"), tmp_path / "cache", log=lambda *_: None)


def test_tokenizer_and_config_agree_on_the_tiny_model(tiny_deepseek_v2):
    assert wt.check_tokenizer(tiny_deepseek_v2) == []


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    return dst


def test_vocab_smaller_than_tokenizer_is_refused(tiny_deepseek_v2, tmp_path):
    model = _copy(tiny_deepseek_v2, tmp_path / "bad-vocab")
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] = 16
    (model / "config.json").write_text(json.dumps(cfg))
    problems = wt.check_tokenizer(model)
    assert any("config.json vocab_size is 16" in p for p in problems), problems


def test_eos_mismatch_is_refused(tiny_deepseek_v2, tmp_path):
    model = _copy(tiny_deepseek_v2, tmp_path / "bad-eos")
    cfg = json.loads((model / "config.json").read_text())
    cfg["eos_token_id"] = 3 if cfg.get("eos_token_id") != 3 else 1
    (model / "config.json").write_text(json.dumps(cfg))
    problems = wt.check_tokenizer(model)
    assert any(p.startswith("eos_token_id") for p in problems), problems


def test_cli_exits_non_zero_with_a_message(tiny_deepseek_v2, tmp_path, capsys):
    model = _copy(tiny_deepseek_v2, tmp_path / "bad")
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] = 16
    (model / "config.json").write_text(json.dumps(cfg))
    assert wt.main(["verify", str(model)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: tokenizer and config.json disagree") and "Traceback" not in err
    assert wt.main(["verify", str(tiny_deepseek_v2)]) == 0


def test_cli_sync_from_a_directory(bucket, tmp_path):
    dest = tmp_path / "cache"
    assert wt.main(["sync", "--source-dir", str(bucket), "--dest", str(dest), "--verify"]) == 0
    assert (dest / "config.json").is_file()


def test_the_tool_runs_in_the_serving_image_without_the_project_dependencies():
    """The image installs this package with --no-deps: the tool may only need the standard
    library (plus tos/transformers, imported lazily), never pulumi or pydantic."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('pulumi', 'pydantic', 'pulumi_kubernetes', 'pulumi_volcengine', 'stacks', 'workloads', 'capacity', 'yaml'):\n"
            "    sys.modules[m] = None\n"
            "import runtime.weights as wt\n"
            "raise SystemExit(wt.main(['sync', '--source-dir', sys.argv[1], '--dest', sys.argv[2]]))\n")
    src = Path(__file__).resolve().parents[1]
    dockerfile = (src / "runtime" / "Dockerfile").read_text()
    assert "COPY runtime ./runtime" in dockerfile and "-r runtime/requirements.txt" in dockerfile
    assert "tos==" in (src / "runtime" / "requirements.txt").read_text()
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "src").mkdir()
        (Path(d) / "src" / "config.json").write_text("{}")
        out = subprocess.run([sys.executable, "-c", code, str(Path(d) / "src"), str(Path(d) / "dst")],
                             cwd=src, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert (Path(d) / "dst" / "config.json").is_file()
