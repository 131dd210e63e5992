"""benchmarks/real_scale.py and benchmarks/gpu_check.py run (their quick modes, on the CPU) and write their JSON;
gpu_check stops itself at its deadline, keeping what it measured (issue 54)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_gpu_check_runs_on_the_cpu_and_writes_json_and_markdown(tmp_path):
    done = run("gpu_check.py", "--device", "cpu", "--quick", "--out", str(tmp_path / "g.json"),
               "--markdown", str(tmp_path / "g.md"))
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["status"] == "complete"
    assert data["bare"]["convnet fp32 channels-last"]["img_per_s"] > 0
    fedavg = data["methods"]["fedavg"]
    assert fedavg["images"] == 3 * 4  # 3 source clients x 1 step x batch 4
    assert abs(fedavg["fraction_of_bare"] * data["bare"]["convnet fp32 channels-last"]["img_per_s"]
               - fedavg["img_per_s"]) < 1e-6 * fedavg["img_per_s"]
    assert "fedavg + client-batching on" in data["methods"]
    assert "| fedavg |" in (tmp_path / "g.md").read_text()


def test_gpu_check_stops_itself_at_its_deadline_and_keeps_its_rows(tmp_path):
    # 1 s: the deadline must fire while work remains whatever the machine's speed (at 4 s an idle machine skipped the
    # rows it had no time for and finished first)
    done = run("gpu_check.py", "--device", "cpu", "--quick", "--deadline", "1", "--out", str(tmp_path / "g.json"),
               "--markdown", str(tmp_path / "g.md"))
    assert done.returncode == -9  # killed with its process group, not waited for
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["status"] == "stopped at the 1 s deadline"
    assert "stopped at the 1 s deadline" in (tmp_path / "g.md").read_text()


def test_real_scale_quick_builds_and_measures_the_pipeline(tmp_path):
    done = run("real_scale.py", "--quick", "--skip-training", "--out", str(tmp_path / "r.json"),
               "--markdown", str(tmp_path / "r.md"))
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "r.json").read_text())
    builds = {k: v for k, v in data["cache_build"].items() if "peak_rss_mb" in v}
    assert len(builds) == 2 and {v["workers"] for v in builds.values()} == {1, 2}
    for row in builds.values():
        assert row["images"] == 96 and row["disk_bytes"] >= 96 * 3 * 32 * 32 and row["peak_rss_mb"] > 0
    domainnet = next(v for k, v in data["cache_build"].items() if k.startswith("DomainNet"))
    assert domainnet["disk_bytes"] == 586_575 * 3 * 32 * 32 and domainnet["extrapolated"]
    assert data["pipeline"]["cpu, 1 thread (per core)"]["img_per_s"] > 0


def load_real_scale():
    import importlib.util

    sys.path.insert(0, str(ROOT / "benchmarks"))  # real_scale imports method_cost from beside it
    spec = importlib.util.spec_from_file_location("real_scale", ROOT / "benchmarks" / "real_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pass_counter_counts_rows_at_the_stem_and_the_classifier_with_and_without_gradients():
    import copy

    import torch

    real_scale = load_real_scale()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 3),
                                torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 5))
    counter = real_scale.PassCounter(model)
    model(torch.zeros(3, 3, 8, 8))  # the image: counted once at the stem, though two convolutions see it
    model(torch.zeros(6, 3, 8, 8))  # two views of 3
    model[4](torch.zeros(4, 32))  # rows added inside the network (oversampled features): the classifier only
    with torch.no_grad():
        model[0](torch.zeros(5, 3, 8, 8))  # a partial pass (a style query up to a layer)
        copy.deepcopy(model)(torch.zeros(2, 3, 8, 8))  # a copy made during the rounds (a frozen global model)
    assert counter.rows == {"stem_grad": 9, "head_grad": 13, "stem_nograd": 7, "head_nograd": 2}
    counter.reset()
    counter.close()
    model(torch.zeros(2, 3, 8, 8))
    assert set(counter.rows.values()) == {0}


def test_real_scale_quick_training_reports_passes_without_the_warm_up_round(tmp_path):
    done = run("real_scale.py", "--quick", "--skip-build", "--methods", "fedavg,stablefdg", "--out",
               str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"))
    assert done.returncode == 0, done.stderr[-2000:]
    training = json.loads((tmp_path / "r.json").read_text())["training"]
    fedavg, stablefdg = training["fedavg"], training["stablefdg"]
    # one forward-backward pass per training image, the warm-up round's passes left out (they would make it 2)
    assert fedavg["passes_per_image"] == 1.0 and fedavg["head_rows_per_image"] == 1.0
    assert fedavg["nograd_stem_rows_per_image"] == 0.0
    assert stablefdg["passes_per_image"] == 1.0
    assert stablefdg["head_rows_per_image"] > 1.0  # its oversampled features join the batch after layer1
    assert stablefdg["nograd_stem_rows_per_image"] > 0.0  # its style query: a partial pass without gradients
    assert abs(fedavg["passes_seconds"] * fedavg["model_img_per_s"] - fedavg["images"]) < 1e-6 * fedavg["images"]
    assert "| stablefdg |" in (tmp_path / "r.md").read_text()
