"""Fixtures shared by the test modules; plain helpers live in tests/helpers.py."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def no_shared_data(request, tmp_path_factory):
    """Every fast test runs as in a fresh clone, which has no ../shared beside it (the team's data, beside its main
    checkout; the configs' default for TEXTREP_SHARED_DATA): a fast test that reads it fails here, for every developer,
    not first on a user's machine (issue 39). Slow tests may read it. A MonkeyPatch of its own, not the test's: undone
    after every other fixture of the test."""
    with pytest.MonkeyPatch.context() as patch:
        if request.node.get_closest_marker("slow") is None:
            patch.setenv("TEXTREP_SHARED_DATA", str(tmp_path_factory.getbasetemp() / "no-shared-data"))
        yield


def pytest_configure(config):
    import pipeline.config  # noqa: F401  registers the config schema that conf/config.yaml composes with


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from tests.helpers import start_session_ray

    start_session_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def family_data(tmp_path_factory, ray_session):
    """family -> a tiny TinyRun of it (checkpointing every 10 steps) whose data stages have run, once per session."""
    from tests.helpers import RESUME_OVERRIDES, TINY_FAMILIES, TinyRun, family_config

    runs = {}

    def get(family: str):
        if family not in runs:
            runs[family] = TinyRun(family_config(tmp_path_factory.mktemp(family), family, RESUME_OVERRIDES))
            for name in TINY_FAMILIES[family].data_stages:
                runs[family].run_stage(name)
        return runs[family]
    return get
