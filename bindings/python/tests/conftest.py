"""Fixtures the binding's test modules share: the shipped model loaded once per module, and the
model file read with the repo's own GGUF reader as an independent view of it."""
import pytest

from support import MODEL, GGUFReader

import moelite  # noqa: E402  (support puts the package on the path)


@pytest.fixture(scope="module")
def gguf():
    return GGUFReader(MODEL)


@pytest.fixture(scope="module")
def model():
    m = moelite.Model(MODEL, threads=2)
    yield m
    m.close()
