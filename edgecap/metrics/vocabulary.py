"""The class set captions are scored against, and the words and phrases that name each class.

One table serves coverage, CHAIR and the live loop: ACVR's 30 classes (the default), COCO's 80,
or the classes of a `--categories` file. A class is named outright by its own name, a label
alias (`CLASS_NAME_ALIASES`) or a synonym (`NOUN_SYNONYMS`, `COCO_EXTRA_SYNONYMS`) whose class is
in the set. Multi-word entries ("teddy bear", "mobile phone") are what the noun extractor
recognises as whole phrases before it takes single nouns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgecap.data.classes import ACVR_CLASSES, CLASS_NAME_ALIASES, NOUN_SYNONYMS, canonical_class
from edgecap.data.coco_categories import COCO_CATEGORIES, load_categories
from edgecap.errors import EdgecapError, did_you_mean

# Caption words for the COCO classes that are not ACVR classes (ACVR words live in
# classes.NOUN_SYNONYMS). "bat" and "glove" are not here: a bat may be the animal and a glove a
# kitchen glove, so they score against baseball bat / baseball glove by their word vectors.
COCO_EXTRA_SYNONYMS: dict[str, str] = {
    "bike": "bicycle", "motorbike": "motorcycle", "motor bike": "motorcycle",
    "scooter": "motorcycle", "plane": "airplane", "jet": "airplane", "aeroplane": "airplane",
    "air plane": "airplane", "airliner": "airplane", "taxi": "car", "van": "car",
    "locomotive": "train", "pickup truck": "truck", "ship": "boat", "canoe": "boat",
    "kayak": "boat", "sailboat": "boat", "stoplight": "traffic light", "hydrant": "fire hydrant",
    "meter": "parking meter", "puppy": "dog", "kitten": "cat", "pony": "horse", "lamb": "sheep",
    "cattle": "cow", "calf": "cow", "bull": "cow", "teddy": "teddy bear", "rucksack": "backpack",
    "purse": "handbag", "necktie": "tie", "bow tie": "tie", "luggage": "suitcase",
    "ball": "sports ball", "football": "sports ball", "soccer ball": "sports ball",
    "tennis ball": "sports ball", "mitt": "baseball glove", "racket": "tennis racket",
    "racquet": "tennis racket", "surf board": "surfboard", "skate board": "skateboard",
    "sub": "sandwich", "burger": "sandwich", "hotdog": "hot dog", "doughnut": "donut",
    "remote control": "remote", "controller": "remote", "hair dryer": "hair drier",
    "blow dryer": "hair drier", "toilet seat": "toilet",
    # a dirt bike is an off-road motorcycle (without this the head word "bike" names bicycle)
    "dirt bike": "motorcycle", "dirtbike": "motorcycle", "motocross bike": "motorcycle",
}

# Words for a person: the person row of the CHAIR paper's synonym list (Rohrbach et al. 2018,
# data/synonyms.txt of its code), less its misspelling "solider", plus the plurals captions use
# ("kids", "players": a noun is lemmatised, but "people", "children" and "men" are listed
# because CHAIR's word scan reads them unlemmatised). A published list, so coverage and the
# offline CHAIR agree on who is a person: "a kid", "a skier", "a rider" name person outright.
PERSON_WORDS: tuple[str, ...] = (
    "girl", "boy", "man", "woman", "kid", "child", "chef", "baker", "people", "adult", "rider",
    "children", "baby", "worker", "passenger", "sister", "biker", "policeman", "cop", "officer",
    "lady", "cowboy", "bride", "groom", "male", "female", "guy", "traveler", "mother", "father",
    "gentleman", "pitcher", "player", "skier", "snowboarder", "skater", "skateboarder",
    "foreigner", "caller", "offender", "coworker", "trespasser", "patient", "politician",
    "soldier", "grandchild", "serviceman", "walker", "drinker", "doctor", "bicyclist", "thief",
    "buyer", "teenager", "student", "camper", "driver", "hunter", "shopper", "villager",
    "men", "women", "persons",
)
PERSON_SYNONYMS: dict[str, str] = dict.fromkeys(PERSON_WORDS, "person")

BUILTIN_TABLES = (CLASS_NAME_ALIASES, NOUN_SYNONYMS, COCO_EXTRA_SYNONYMS, PERSON_SYNONYMS)


def singular_forms(name: str) -> list[str]:
    """The singulars an English plural class name may have ("skis" -> "ski", "scissors" ->
    "scissor", "knives" -> "knife", "knive"), as the lemmatiser reduces a caption's plural noun,
    so a plural class name is named by its singular too. Only the head (last) word changes;
    "bus" and "glass" are left alone (-us, -ss); a singular that is no word ("tenni" of
    "tennis") names what no caption says, so it is harmless."""
    *mods, head = name.split(" ")
    forms: list[str] = []
    if head.endswith("ies") and len(head) > 4:
        forms.append(head[:-3] + "y")
    elif head.endswith("ves"):
        forms += [head[:-3] + "f", head[:-3] + "fe", head[:-1]]
    elif head.endswith(("ches", "shes", "sses", "xes", "zes")):
        forms.append(head[:-2])
    elif head.endswith("s") and not head.endswith(("ss", "us")) and len(head) > 3:
        forms.append(head[:-1])
    return [" ".join([*mods, form]) for form in forms]


@dataclass(frozen=True)
class ClassVocabulary:
    """`classes` and `names`: lower-case word or phrase -> the class it names; `tables`: the
    {word: class} tables a class added later (`with_classes`) takes its names from."""

    classes: tuple[str, ...]
    names: dict[str, str] = field(hash=False)
    origin: str = ""
    tables: tuple[dict[str, str], ...] = field(default=BUILTIN_TABLES, hash=False, repr=False, compare=False)

    @classmethod
    def build(cls, classes, origin: str = "", extra: dict[str, str] | None = None,
              builtin: bool = True) -> ClassVocabulary:
        """The vocabulary of `classes`: their names (and a plural name's singulars), plus the
        built-in aliases and synonyms of those classes (`builtin`) and `extra` {word: class} (a
        synonyms file's table)."""
        tables = (*(BUILTIN_TABLES if builtin else ()), *((extra,) if extra else ()))
        return cls((), {}, origin, tables).with_classes(classes)

    def with_classes(self, classes, origin: str | None = None) -> ClassVocabulary:
        """This vocabulary and `classes` (canonical names, `class_named`): the class set follows
        the objects. Each class is named by its own name, its singulars when the name is a plural
        (`singular_forms`), and the tables' words for it. `self` when nothing is new."""
        classes = tuple(dict.fromkeys((*self.classes, *classes)))
        if classes == self.classes and origin is None:
            return self
        members = set(classes)
        names: dict[str, str] = {}
        for table in self.tables:
            for word, name in table.items():
                if name in members:
                    names[word] = name
        for name in classes:
            for form in singular_forms(name):
                names.setdefault(form, name)
        names.update({name: name for name in classes})
        return ClassVocabulary(classes, names, self.origin if origin is None else origin, self.tables)

    def class_named(self, name: str) -> str:
        """The class an object's class name stands for, read as a caption noun naming it is:
        lower-case, "_" as a space, label aliases ("tv" -> television), then what this
        vocabulary or edgecap's known classes (`KNOWN`) name by it ("monitor" -> television,
        "puppy" -> dog, "ski" -> skis); else the name itself, a class of its own."""
        key = canonical_class(name)
        return self.class_of(key) or KNOWN.class_of(key) or key

    def knows(self, name: str) -> bool:
        """Whether a canonical class name (`class_named`) is a class of this vocabulary or of
        edgecap's known classes (COCO's 80, which hold ACVR's 30)."""
        return name in self.names or name in KNOWN.names

    @property
    def phrases(self) -> list[str]:
        """The multi-word names, longest first."""
        return sorted((p for p in self.names if " " in p), key=lambda p: (-len(p.split()), p))

    def class_of(self, noun: str) -> str | None:
        """The class a noun names outright: listed itself, or a compound whose head word is
        listed ("coffee mug" -> mug -> cup). Nothing else is an exact name: "bear" does not name
        teddy bear, "dog" does not name hot dog."""
        hit = self.names.get(noun)
        if hit is None and " " in noun:
            hit = self.names.get(noun.rsplit(" ", 1)[1])
        return hit

    def head_names(self, phrase: str) -> bool:
        """Whether a multi-word name's head word names the same class ("cell phone": a phone
        is a cell phone; "hot dog": a dog is not), so its head word's vector stands for it."""
        head = phrase.rsplit(" ", 1)[-1]
        whole = self.class_of(phrase)
        return whole is None or self.names.get(head) == whole


ACVR = ClassVocabulary.build(ACVR_CLASSES, "ACVR's 30 classes")
# COCO's 80 in ACVR's spelling first (television for tv), then the others in id order
COCO = ClassVocabulary.build(
    tuple(ACVR_CLASSES) + tuple(n for n in COCO_CATEGORIES.values() if canonical_class(n) not in ACVR_CLASSES),
    "COCO's 80 classes")
NAMED = {"acvr": ACVR, "coco": COCO}
KNOWN = COCO  # every class edgecap has names for: a ground-truth name is read against these too


def vocabulary_of(names, origin: str) -> ClassVocabulary:
    """The vocabulary of a class list read from a file (a `--categories` file's names): each
    name canonicalised (tv -> television); a duplicate or empty name is refused in one line."""
    seen: dict[str, str] = {}
    for raw in names:
        name = canonical_class(raw) if isinstance(raw, str) else ""
        if not name:
            raise EdgecapError(f"{origin}: an empty class name ({raw!r}); every class needs a name")
        if name in seen:
            same = "" if seen[name] == raw else f" (as {seen[name]!r})"
            raise EdgecapError(f"{origin}: class name {raw!r} appears twice{same}; class names must be distinct")
        seen[name] = raw
    return ClassVocabulary.build(seen, origin)


def load_vocabulary(spec: str | None) -> ClassVocabulary:
    """`acvr` (default), `coco`, or a categories file (COCO annotation JSON, YOLO data.yaml)."""
    if spec is None or spec.lower() in NAMED:
        return NAMED[(spec or "acvr").lower()]

    if not Path(spec).expanduser().exists():
        raise EdgecapError(f"--classes {spec}: not a class set ({', '.join(NAMED)}){did_you_mean(spec.lower(), NAMED)} "
                           "and no such file (a COCO annotation JSON or a YOLO data.yaml)")
    categories = load_categories(spec, "--classes")
    return vocabulary_of(categories.names.values(), categories.origin)
