"""``python -m suite list --json``: breadth of the suite and the metadata the harness reads."""

from __future__ import annotations

import json

import pytest

from suite.registry import DOMAINS, EXTRA_MODELS_ENV, list_models, load_metadata
from tests.suite.helpers import FIXTURE_MODELS, run_suite

FIXTURE_NAMES = {p.name for p in FIXTURE_MODELS.iterdir() if (p / "metadata.yaml").is_file()}


def _listing(**env: str) -> list[dict]:
    proc = run_suite(["list", "--json"], **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_list_json_covers_twenty_models_and_six_domains() -> None:
    models = _listing()
    assert len(models) >= 20
    assert {m["domain"] for m in models} == set(DOMAINS)
    for m in models:
        assert set(m) >= {
            "name",
            "domain",
            "task",
            "modes",
            "devices",
            "compilers",
            "train_batch_size",
            "eval_batch_size",
            "benchmark_version",
        }
        # A model may support less (quantized inference: eval on CPU, eager); never nothing.
        assert m["modes"] and set(m["modes"]) <= {"train", "eval"}, m["name"]
        assert "cpu" in m["devices"] and set(m["devices"]) <= {"cpu", "cuda"}, m["name"]
        assert "eager" in m["compilers"] and set(m["compilers"]) <= {"eager", "inductor"}
        for mode in m["modes"]:
            sizes = m[f"{mode}_batch_size"]
            assert set(sizes) == set(m["devices"]), m["name"]
            assert all(isinstance(n, int) and n >= 1 for n in sizes.values()), m["name"]
        assert len(m["benchmark_version"]) == 16
    names = [m["name"] for m in models]
    assert names == sorted(names)


def test_computer_vision_covers_classification_detection_segmentation_generation() -> None:
    tasks = {m["task"] for m in _listing() if m["domain"] == "computer_vision"}
    assert {"classification", "detection", "segmentation", "generation"} <= tasks


def test_test_only_models_stay_out_of_the_real_listing() -> None:
    assert not FIXTURE_NAMES & {m["name"] for m in _listing()}
    with_fixtures = {m["name"] for m in _listing(**{EXTRA_MODELS_ENV: str(FIXTURE_MODELS)})}
    assert FIXTURE_NAMES <= with_fixtures


def test_every_metadata_describes_itself() -> None:
    for info in list_models():
        meta = load_metadata(info.name)
        assert str(meta.get("description", "")).strip(), info.name
        assert str(meta.get("task", "")).strip(), info.name


def test_bad_extra_models_path_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EXTRA_MODELS_ENV, "/no/such/folder")
    with pytest.raises(ValueError, match="/no/such/folder"):
        list_models()


def test_duplicate_model_name_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import shutil

    from suite.registry import MODELS_DIR

    shutil.copytree(MODELS_DIR / "ppo", tmp_path / "ppo")
    monkeypatch.setenv(EXTRA_MODELS_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="'ppo' is defined in both"):
        list_models()


@pytest.mark.parametrize(
    ("count_settings", "message"),
    [
        ("{image_sise: 32}", "overrides 'image_sise', which is not one of the model's settings"),
        ("{modes: [eval]}", "cannot override 'modes'"),
        ("32", "must be a non-empty mapping"),
        ("{}", "must be a non-empty mapping"),
    ],
)
def test_count_settings_override_only_the_models_own_settings(
    tmp_path, count_settings: str, message: str
) -> None:
    """A misspelt count setting would count the full-size step without a word: it is refused,
    naming the file and the key."""
    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "metadata.yaml").write_text(
        f"domain: other\ntask: toy\nimage_size: 96\ncount_settings: {count_settings}\n"
    )
    with pytest.raises(ValueError, match=message) as err:
        load_metadata("toy", tmp_path)
    assert "toy/metadata.yaml" in str(err.value)
    (folder / "metadata.yaml").write_text(
        "domain: other\ntask: toy\nimage_size: 96\ncount_settings: {image_size: 32}\n"
    )
    assert load_metadata("toy", tmp_path)["count_settings"] == {"image_size": 32}
