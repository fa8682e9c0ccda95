"""Fixtures: one real mesh (etcd, control, sidecars a and b) for the whole session."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from harness import Mesh, start_mesh


@pytest.fixture(scope="session")
def mesh() -> Iterator[Mesh]:
    m = start_mesh()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def unique() -> str:
    """A suffix that keeps each test's agents and capabilities apart."""
    return uuid.uuid4().hex[:8]


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)
