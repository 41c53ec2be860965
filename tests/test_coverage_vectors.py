"""A robot loads only the word vectors it can use: the packaged GloVe rows for a bundle's
vocabulary and the class names (edgecap.metrics.subset), written by `edgecap export` and read by
the runtime; every vector and every score is what the whole table gives."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("spacy")

from edgecap.metrics.coverage import CoverageScorer  # noqa: E402
from edgecap.metrics.glove import load_glove, write_subset  # noqa: E402
from edgecap.metrics.subset import candidate_words  # noqa: E402
from edgecap.metrics.vocabulary import COCO  # noqa: E402

CAPTIONS = [c["caption"].lower() for c in json.loads(
    (Path(__file__).parent / "data" / "real_style_captions.json").read_text(encoding="utf-8"))["captions"]]
# a bundle's vocabulary: the words of these captions
WORDS = sorted({w for c in CAPTIONS for w in c.replace(".", " ").split()})


@pytest.fixture(scope="module")
def subset(tmp_path_factory):
    path = tmp_path_factory.mktemp("vectors") / "coverage_vectors.npz"
    write_subset(path, candidate_words(WORDS))
    return path


def test_the_subset_holds_the_whole_tables_rows_and_is_small(subset):
    whole, part = load_glove(), load_glove(str(subset))
    for word in candidate_words(WORDS):
        mine, theirs = part.vector(word), whole.vector(word)
        assert (mine is None) == (theirs is None), word
        if mine is not None:
            assert (mine == theirs).all(), word
    assert len(part) < 3000 and subset.stat().st_size < 1_000_000
    assert "skis" in part and "dog" in part and "hydrant" in part  # class-name words are there
    assert (part.vector("forklift") == whole.vector("forklift")).all()  # not considered: the whole table


def test_scores_with_the_subset_are_the_whole_tables(subset):
    classes = list(COCO.classes)
    gts = [{classes[(7 * i + k) % len(classes)]: 0.02 * (k + 1) for k in range(4)} for i in range(len(CAPTIONS))]
    gts = [{**gt, "forklift": 0.05} if i % 9 == 0 else gt for i, gt in enumerate(gts)]  # a word outside it
    whole = CoverageScorer(warn=lambda line: None).score(CAPTIONS, gts)
    part = CoverageScorer(glove=str(subset), warn=lambda line: None).score(CAPTIONS, gts)
    for a, b in zip(whole, part, strict=True):
        assert a.coverage == b.coverage and a.to_json() == b.to_json(), a.caption
    assert sum(m.profit for r in whole for m in r.matches[0.01] if not m.exact) > 1.0  # soft profits compared too


def test_scoring_with_the_subset_needs_no_pyarrow_and_not_all_of_scipy(subset):
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from edgecap.metrics.coverage import CoverageScorer\n"
            f"s = CoverageScorer(glove={str(subset)!r})\n"
            "r = s.score(['a man rides a dirt bike past a fire hydrant'], [{'person': 0.2, 'motorcycle': 0.1}])[0]\n"
            "print(r.coverage[0.01], 'scipy.optimize' in sys.modules, 'h5py' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1.0", "False", "False"]


def test_an_export_writes_the_vectors_and_the_runtime_reads_them(tmp_path):
    pytest.importorskip("torch")
    from edgecap.runtime.scoring import bundle_vectors
    from edgecap.runtime.session import Bundle
    from tests._export_util import cnn_bundle

    root = cnn_bundle(tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    entry = manifest["coverage"]
    assert entry["vectors"] == "coverage_vectors.npz" and entry["words"] > 100
    bundle = Bundle.load(root)
    path = bundle_vectors(bundle)
    assert path == str(root / "coverage_vectors.npz")
    table = load_glove(path)
    assert "person" in table and len(table) == entry["words"]
    (root / "coverage_vectors.npz").write_bytes(b"not the file")  # the manifest's hash guards it
    with pytest.raises(Exception, match="coverage_vectors.npz"):
        Bundle.load(root)


def test_spacy_loads_without_its_command_line_and_the_command_line_still_works():
    code = ("import sys\n"
            "from edgecap.metrics.nouns import NounExtractor\n"
            "print(NounExtractor()(['a man skis down a hill'])[0])\n"
            "print(sorted({'torch', 'h5py', 'rich', 'typer', 'requests', 'spacy.cli'} & set(sys.modules)))\n"
            "import spacy\n"
            "print(sorted(spacy.info()))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    nouns, loaded, info = run.stdout.splitlines()
    assert nouns == "['man', 'hill']" and loaded == "[]"
    assert "spacy_version" in info  # spacy.info() imports the real command line when called
