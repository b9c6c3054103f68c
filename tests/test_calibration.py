"""The tuner's calibration cache: a group calibrates once per machine and later groups reuse
it; a corrupt, mismatched or unreadable file is measured again (and replaced where it can be),
never a crash; every rank gets rank 0's model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lib_dist.cluster import Cluster
from lib_dist.comm.fast import calibration
from lib_dist.comm.fast.tuner import NATIVE, Fit, TunerModel
from lib_dist.comm.trace import AlphaBeta

from rank_threads import Threads

pytestmark = pytest.mark.timeout(180)

CANDIDATES = ("ring", NATIVE)


def key(world_size: int = 2) -> dict:
    return calibration.machine_key(world_size, "gloo", "backend", CANDIDATES,
                                   [("host", "boot")] * world_size)


def model(margin: float = 0.5, world_size: int = 2) -> TunerModel:
    return TunerModel(world_size, AlphaBeta(1e-5, 2e9),
                      {"ring": Fit(1e-4, 0.5), NATIVE: Fit(2e-4, 1.0)}, margin,
                      {"ring": {4096: 1e-3}, NATIVE: {4096: 2e-3}})


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def on_threads(world_size: int, measured: TunerModel, the_key: dict | None = None):
    """Every thread rank's model from `cached_or_calibrated`, and how many ranks measured."""
    calls: list[int] = []

    def rank_fn(rank, gather):
        def calibrate():
            calls.append(rank)
            return measured
        return calibration.cached_or_calibrated(rank, the_key or key(world_size),
                                                lambda v: gather(v)[0], calibrate)

    return Threads(world_size).run(rank_fn), calls


def test_the_first_group_measures_and_saves_later_ones_reuse(cache):
    first, calls = on_threads(2, model(0.5))
    assert sorted(calls) == [0, 1]  # every rank took part
    assert len(list(cache.glob("tuner-*.json"))) == 1
    later, calls = on_threads(2, model(0.9))  # would measure 0.9: must not measure
    assert calls == []
    assert later == [model(0.5), model(0.5)]
    assert later[0].timings == model(0.5).timings


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong numbers", "other key"])
def test_a_corrupt_file_is_measured_again_and_replaced(cache, damage):
    on_threads(2, model(0.5))
    [path] = cache.glob("tuner-*.json")
    stored = json.loads(path.read_text())
    if damage == "garbage":
        path.write_bytes(b"\x00\xff not json")
    elif damage == "truncated":
        path.write_text(path.read_text()[:40])
    elif damage == "wrong numbers":
        stored["model"]["beta"] = -1.0
        path.write_text(json.dumps(stored))
    else:
        stored["key"]["world_size"] = 3
        path.write_text(json.dumps(stored))
    got, calls = on_threads(2, model(0.7))
    assert sorted(calls) == [0, 1] and got == [model(0.7)] * 2
    assert json.loads(path.read_text())["model"]["margin"] == 0.7  # replaced


def test_another_world_size_or_transport_measures_again(cache):
    on_threads(2, model(0.5))
    _, calls = on_threads(3, model(0.6, world_size=3))
    assert sorted(calls) == [0, 1, 2]
    other = calibration.machine_key(2, "gloo", "shared_memory", CANDIDATES, [("host", "boot")] * 2)
    _, calls = on_threads(2, model(0.6), other)
    assert sorted(calls) == [0, 1]


def test_a_cache_that_cannot_be_written_is_only_read(cache):
    cache.parent.mkdir(exist_ok=True)
    cache.write_text("a file where the directory should be")
    got, calls = on_threads(2, model(0.5))
    assert sorted(calls) == [0, 1] and got == [model(0.5)] * 2


def test_off_means_no_cache(monkeypatch):
    monkeypatch.setenv(calibration.CACHE_ENV, "off")
    assert calibration.cache_dir() is None
    _, calls = on_threads(2, model(0.5))
    _, again = on_threads(2, model(0.5))
    assert sorted(calls) == sorted(again) == [0, 1]


def test_the_default_is_the_users_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(calibration.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert calibration.cache_dir() == tmp_path / "lib_dist"


def tuner_of(comm):
    comm.all_reduce(torch.ones(4))
    return comm.tuner


@pytest.mark.cluster
def test_engines_use_the_cached_calibration_and_replace_a_corrupt_one(cache):
    with Cluster(2, timeout=30) as cluster:
        measured = cluster.run(tuner_of)
        assert measured[0] == measured[1]
        [path] = cache.glob("tuner-*.json")
        stored = json.loads(path.read_text())
        stored["model"]["margin"] = 0.123  # a mark no calibration makes
        path.write_text(json.dumps(stored))
        cluster.restart()  # a new group, as a new submission's would be
        assert [t.margin for t in cluster.run(tuner_of)] == [0.123, 0.123]
        path.write_text("{ corrupt")
        cluster.restart()
        again = cluster.run(tuner_of)
        assert again[0] == again[1] and again[0].margin != 0.123
        assert json.loads(path.read_text())["model"]["margin"] == again[0].margin


def test_the_grader_can_tell_this_machine_calibrated_a_world_size(cache):
    import socket

    from lib_dist.comm.fast.files import boot_id

    assert not calibration.calibrated_here(2)
    calibration.save(key(2), model())  # another host's: does not count
    assert not calibration.calibrated_here(2)
    here = calibration.machine_key(2, "gloo", "backend", CANDIDATES,
                                   [(socket.gethostname(), boot_id())] * 2)
    calibration.save(here, model())
    assert calibration.calibrated_here(2) and not calibration.calibrated_here(3)
