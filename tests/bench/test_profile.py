"""`python -m mini bench profile`: the step-part timers and the op groups add up, on a tiny run."""

from __future__ import annotations

from types import SimpleNamespace

from mini.bench import profile, workload


def test_ops_are_grouped_by_name_and_unknown_ones_fall_in_other():
    events = [SimpleNamespace(key="aten::mm", self_cpu_time_total=2e6),
              SimpleNamespace(key="aten::index_select", self_cpu_time_total=1e6),
              SimpleNamespace(key="aten::mul", self_cpu_time_total=5e5),
              SimpleNamespace(key="aten::view", self_cpu_time_total=25e4)]
    assert profile.group_ops(events) == {"matmul": 2.0, "attention": 1.0, "element-wise": 0.5, "other": 0.25}


def test_profile_run_reports_every_part_and_a_parsable_last_line(capsys, monkeypatch):
    corpus = workload.load_corpus_text
    monkeypatch.setattr(workload, "load_corpus_text", lambda max_bytes=0: corpus(60_000))  # tokenizes faster
    assert profile.main(["--num-prompts", "4", "--output-len", "4", "12", "--max-num-batched-tokens", "256",
                         "--top-ops", "3"]) == 0
    out = capsys.readouterr().out
    step_table = out.split("1. step parts")[1].split("2. inside")[0].splitlines()[2:]
    rows = {line[:22].strip(): line[22:].split() for line in step_table if line.strip()}
    assert list(rows) == list(profile.PARTS)
    shares = [float(rows[part][1].rstrip("%")) for part in profile.PARTS]
    assert 95.0 <= sum(shares) <= 101.0  # "other" is the remainder: the parts cover each step once
    fields = dict(item.split("=") for item in out.strip().splitlines()[-1].split())
    assert set(fields) == {"model_share", "engine_ms_per_step", "attention_share_of_model"}
    assert 0.0 < float(fields["model_share"]) <= 1.0 and float(fields["engine_ms_per_step"]) > 0.0
    assert 0.0 < float(fields["attention_share_of_model"]) < 1.0
