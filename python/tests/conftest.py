"""Fixtures of the leasehold Python suite.

Stores: every store-generic test runs on SQLite (a fresh file) and on
PostgreSQL when ``LEASEHOLD_TEST_PG`` names a server (``.ci/run`` sets
it); without it those cases are skipped with a notice saying so. Names
(keys, queues) are unique per test, so runs on a shared server never meet.
"""

import os
import uuid

import pytest

PG = os.environ.get("LEASEHOLD_TEST_PG")


def pytest_report_header(config):
    if PG:
        return f"leasehold: PostgreSQL cases run on LEASEHOLD_TEST_PG={PG}"
    return "leasehold: LEASEHOLD_TEST_PG is unset: the PostgreSQL cases are SKIPPED"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    """A store URL: a new SQLite file, or the test PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'leasehold.db'}"
    if not PG:
        pytest.skip("LEASEHOLD_TEST_PG is unset: skipping the PostgreSQL case")
    return PG


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:{tmp_path / 'leasehold.db'}"


@pytest.fixture
def name():
    """A key or queue name no other test uses."""
    return "t-" + uuid.uuid4().hex[:12]
