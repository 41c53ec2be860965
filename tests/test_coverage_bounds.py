"""What a robot that runs for weeks needs of the metrics: no torch, and caches that stay bounded."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("spacy")

from edgecap.metrics.nouns import NounExtractor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> str:
    env_path = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": env_path}, cwd=ROOT)
    return out.stdout.strip().splitlines()[-1]


def test_loading_spacy_leaves_torch_out_even_where_torch_is_installed():
    assert _python("import sys, edgecap.metrics.nouns as n; n.load_spacy(); print('torch' in sys.modules)") == "False"


def test_coverage_and_the_live_annotator_score_without_torch():
    code = ("import sys\n"
            "from edgecap.runtime.scoring import CoverageAnnotator\n"
            "from edgecap.runtime.sources import KnownObject\n"
            "a = CoverageAnnotator()\n"
            "a.warm_up()\n"
            "cov, matches = a.score('a teddy bear on a bed', [KnownObject('bed', (0, 0, 9, 9), 0.2)])\n"
            "assert cov['>1%'] == 1.0, cov\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    assert _python(code) == "[]"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed here")
def test_a_process_that_holds_torch_keeps_it():
    code = ("import sys, torch, edgecap.metrics.nouns as n; nlp = n.load_spacy(); "
            "print(sys.modules['torch'] is torch and len(list(nlp('a cup'))) == 2)")
    assert _python(code) == "True"


def test_a_failed_torch_import_inside_the_window_does_not_stick():
    """torch stays importable after spaCy loaded (a training process may want it later)."""
    code = ("import sys, importlib.util, edgecap.metrics.nouns as n; n.load_spacy(); "
            "print(importlib.util.find_spec('torch') is not None or 'no torch')")
    assert _python(code) in ("True", "no torch")


def test_the_noun_cache_is_bounded_and_keeps_the_recent_captions():
    extract = NounExtractor(cache_size=8)
    captions = [f"a cup next to {n} bowls" for n in range(30)]
    first = extract(captions)
    assert len(extract._cache) == 8
    assert list(extract._cache) == captions[-8:]
    again = extract(captions[::-1])  # evicted ones are parsed again, and give the same nouns
    assert again == first[::-1]
    assert len(extract._cache) == 8
    extract([captions[5]] * 3 + [captions[6]])  # a hit moves to the recent end
    assert list(extract._cache)[-2:] == [captions[5], captions[6]]


def test_vector_caches_are_bounded():
    from edgecap.metrics.coverage import VECTOR_CACHE, CoverageScorer
    from edgecap.metrics.glove import VECTOR_CACHE as ROWS

    scorer = CoverageScorer()
    for i in range(ROWS + 500):
        scorer.glove.vector(f"zz-not-a-word-{i}")
    assert scorer.glove.vector.cache_info().currsize == ROWS
    for i in range(VECTOR_CACHE + 10):
        scorer.phrase_vector(f"qq{i} cup")
    assert scorer.phrase_vector.cache_info().currsize == VECTOR_CACHE

def test_cached_captions_share_one_string_per_noun():
    """A weeks-long run caches thousands of captions over a few hundred nouns: each noun is held
    once, not once per caption (half of a cached caption's memory)."""
    extract = NounExtractor(cache_size=8)
    first, second = extract.mentions(["a red cup on a wooden table", "two cups near the wooden table"])
    assert first == second == ("cup", "table")
    assert first[0] is second[0] and first[1] is second[1]
