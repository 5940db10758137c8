"""A profile's `method` is the tasks' default: `plan` runs it when --method is not given, and
--method (or a .cake file's own) still wins."""

from __future__ import annotations

from dataclasses import replace

import yaml

from cake_cli.tasks.planning import plan
from cake_cli.tasks.request import TaskRequest


def _profile_dir(tiny_profile_dir, tmp_path, method, **settings):
    data = yaml.safe_load((tiny_profile_dir / "tiny-test.yaml").read_text())
    data.update(name="tiny-chunk", method=method, **settings)
    out = tmp_path / "profiles"
    out.mkdir()
    (out / "tiny-chunk.yaml").write_text(yaml.safe_dump(data))
    (out / "tiny-test.yaml").write_text((tiny_profile_dir / "tiny-test.yaml").read_text())
    return out


def test_the_profile_method_runs_unless_method_is_given(cli_env, tiny_profile_dir, monkeypatch):
    monkeypatch.setenv("CAKE_PROFILES_DIR", str(_profile_dir(tiny_profile_dir, cli_env, "cake-chunk")))
    doc = cli_env / "notes.txt"
    doc.write_text("The gull rock lighthouse was lit in 1871 by the keeper. " * 40, encoding="utf-8")
    ask = dict(task="qa", document=str(doc), fields={"question": "When was it lit?"}, model="tiny-chunk", budget=64)

    chosen = plan(TaskRequest(**ask))
    assert (chosen.config.allocation, chosen.config.indicator, chosen.request.method) == ("cake", "chunk", "cake-chunk")
    given = plan(TaskRequest(**ask, method="snapkv"))
    assert (given.config.allocation, given.config.indicator, given.request.method) == ("uniform", "snapkv", "snapkv")
    plain = plan(TaskRequest(**{**ask, "model": "tiny-test"}))  # no `method:` in its profile: the paper's CAKE
    assert (plain.config.indicator, plain.request.method) == ("cake", "cake")
    assert chosen.config.chunk == plain.config.chunk == 10, "no `chunk:` in the profile: ChunkKV's 10 tokens"


def test_the_profile_chunk_sets_the_chunk_size(cli_env, tiny_profile_dir, monkeypatch):
    monkeypatch.setenv("CAKE_PROFILES_DIR", str(_profile_dir(tiny_profile_dir, cli_env, "cake-chunk", chunk=20)))
    request = TaskRequest(task="qa", document="-", fields={"question": "When?"}, model="tiny-chunk", budget=64)
    from cake_cli.models.profiles import load_profile
    from cake_cli.tasks.planning import cake_config_for

    config, _ = cake_config_for(load_profile("tiny-chunk"), request)
    assert (config.indicator, config.chunk) == ("chunk", 20)


def test_reconstruct_runs_the_papers_cake_under_a_profile_method(cli_env, tiny_profile_dir, monkeypatch):
    """--scoring reconstruct ranks by the reconstruction's attention: the profile's cake-chunk gives way to
    cake when nothing was named; a named --method cake-chunk is still refused there in one line."""
    import pytest

    from cake_cli.errors import UsageError
    from cake_cli.tasks.request import COMPRESS
    from cake_cli.tasks.saved.request import check_scoring_method, scoring_request

    monkeypatch.setenv("CAKE_PROFILES_DIR", str(_profile_dir(tiny_profile_dir, cli_env, "cake-chunk")))
    doc = cli_env / "notes.txt"
    doc.write_text("The gull rock lighthouse was lit in 1871 by the keeper. " * 40, encoding="utf-8")
    request = TaskRequest(task=COMPRESS, document=str(doc), fields={}, model="tiny-chunk", budget=64)
    assert plan(scoring_request(request, "question")).config.indicator == "chunk"  # kept whole: asked later
    rebuilt = plan(scoring_request(request, "reconstruct"))
    assert (rebuilt.config.allocation, rebuilt.config.indicator) == ("cake", "cake")
    check_scoring_method(rebuilt, "reconstruct")
    named = plan(scoring_request(replace(request, method="cake-chunk"), "reconstruct"))
    with pytest.raises(UsageError, match="it takes no chunk indicator"):
        check_scoring_method(named, "reconstruct")
