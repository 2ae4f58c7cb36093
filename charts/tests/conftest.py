"""Chart tests: render every profile combination up front, a few helm processes at a time (each
render is cached in chartlib, so the tests then only read)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from chartlib import API_VARIANTS, KUBE_VERSIONS, PROFILES, render_text


@pytest.fixture(scope="session", autouse=True)
def _prerender() -> None:
    combos = [(p, k, a) for p in PROFILES for k in KUBE_VERSIONS for a in API_VARIANTS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda c: render_text(*c), combos))
