"""The words coverage can ask a vector for when it scores one bundle's captions, and the file of
their vectors a bundle carries (`edgecap export` writes it; the runtime reads it instead of the
400,000-word table: docs/coverage.md, "A robot loads only what it can use").

A caption is the bundle's vocabulary words. Coverage looks up a vector for a noun's words (each
as written, its head lemmatised) and for a class name's words, so the words are: every
vocabulary word, its singulars and its lemma as a noun (spaCy's lemmatizer, when installed at
export), "glasses", and every word of every class name and synonym edgecap knows. A word outside
them (a detector's own class name) is looked up in the whole table, so no score changes.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from edgecap.errors import MissingExtraError
from edgecap.metrics.nouns import EYEWEAR, load_spacy
from edgecap.metrics.vocabulary import BUILTIN_TABLES, KNOWN, singular_forms


def candidate_words(vocabulary_words) -> list[str]:
    """Every word coverage may look up a vector for, for captions made of `vocabulary_words`."""
    words = [str(w).lower() for w in vocabulary_words]
    out = list(words)
    for w in words:
        out += singular_forms(w)
    out += _noun_lemmas(words)
    names = [*KNOWN.names, *KNOWN.classes, *(n for table in BUILTIN_TABLES for pair in table.items() for n in pair)]
    out += [part for name in names for part in name.split()]
    out.append(EYEWEAR)
    return list(dict.fromkeys(out))


@lru_cache(maxsize=1)
def _spacy():
    """The English pipeline, once per process (an export process may export many bundles);
    None without spaCy."""
    try:
        return load_spacy()
    except (MissingExtraError, OSError):
        return None


def _noun_lemmas(words: list[str]) -> list[str]:
    """Each word's lemma as a singular and as a plural noun, by spaCy's lemmatizer ([] without
    spaCy: the whole table then answers for an irregular plural's lemma)."""
    nlp = _spacy()
    if nlp is None:
        return []
    from spacy.tokens import Doc

    lemmatizer = nlp.get_pipe("lemmatizer")
    out = []
    for word in words:
        if not word or any(c.isspace() for c in word):
            continue
        for tag in ("NN", "NNS"):
            tok = Doc(nlp.vocab, words=[word])[0]
            tok.tag_, tok.pos_ = tag, "NOUN"
            if tag == "NNS":
                tok.set_morph("Number=Plur")
            out += [lemma.lower() for lemma in lemmatizer.lemmatize(tok)]
    return out


def write_bundle_vectors(bundle_dir: Path, vocabulary_words, file: str) -> int | None:
    """Write the vectors of `candidate_words` into the bundle as `file`; their number, or None
    when the packaged vectors are not installed (edgecap[nlp]): the runtime then uses the whole
    table, as before."""
    from edgecap.metrics.glove import write_subset

    try:
        return write_subset(Path(bundle_dir) / file, candidate_words(vocabulary_words))
    except MissingExtraError:
        return None
