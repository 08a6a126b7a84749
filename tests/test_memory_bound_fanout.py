"""The memory bound of a zoo sweep (``check MODEL... [--ray ADDRESS]``): each model's check runs
under the bound the driver was given, on a Ray worker as in the local pool.

Found on the merged tree: ``check A B --memory-bound 300M`` was exit 70 (KeyError: the fan-out
copied each option it was given into the checks' arguments, and --memory-bound keeps no value);
and a check on a Ray worker ran unbounded, since ``--memory-bound`` (and the driver's
``REPROKIT_MEMORY_BOUND``) lived only in the driver's environment, which a Ray worker does not
share. The bomb here is 512 MiB: safe unbounded, past a 300 MiB bound.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_memory_bound import expand_bomb

from reprokit.engine import memorybound
from tests.models import save

BOMB_ROWS = 8 << 20  # 8M rows x 16 float32: 512 MiB on the way to the same 1x4 output


@pytest.fixture
def two_models(tmp_path) -> list[str]:
    """The Expand bomb and the same graph at 1 KiB (NaN under emulate:fp16: exit 1 unbounded)."""
    return [
        save(expand_bomb(BOMB_ROWS), tmp_path / "bomb.onnx"),
        save(expand_bomb(16), tmp_path / "small.onnx"),
    ]


def test_several_models_take_the_bound_and_each_check_runs_under_it(two_models):
    # old code: exit 70, "internal error: KeyError: 'memory_bound'"
    proc = run_cli(
        "check",
        *two_models,
        "--target",
        "emulate:fp16",
        "--memory-bound",
        "300M",
        "--json",
        env={memorybound.ENV: "off"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the small model diverges
    rows = json.loads(proc.stdout)["results"]
    assert [r["exit_code"] for r in rows] == [11, 1], rows
    assert "ran out of its memory bound of 300 MiB" in rows[0]["stderr"], rows[0]


@pytest.fixture
def ray_without_a_bound(monkeypatch):
    """A Ray cluster of one CPU started before the driver has a bound: its workers' environment
    is the cluster's, as on any cluster reprokit joins by address."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'reprokit[matrix]'")
    monkeypatch.delenv(memorybound.ENV, raising=False)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_a_check_on_a_ray_worker_runs_under_the_drivers_bound(
    two_models, ray_without_a_bound, monkeypatch, capsys
):
    from reprokit.matrix.fanout import check_many

    monkeypatch.setenv(memorybound.ENV, "300M")  # what --memory-bound 300M does in the driver
    # old code: the worker's check ran the 512 MiB Expand unbounded: exit 1, a verdict
    code = check_many(
        two_models,
        ["--target", "emulate:fp16"],
        out_dir=None,
        as_json=True,
        ray_address="auto",
        gpus=None,
        jobs=1,
    )
    rows = json.loads(capsys.readouterr().out)["results"]
    assert code == 1 and [r["exit_code"] for r in rows] == [11, 1], rows
    assert "ran out of its memory bound of 300 MiB" in rows[0]["stderr"], rows[0]
