"""Object classes of the ACRV Robotic Vision Challenge (a COCO subset) and their synonyms.

Shared by the synthetic world (which objects it draws), the ACVR loader (class-name
normalisation) and the coverage / CHAIR metrics (noun-to-class matching). Torch-free.
"""

from __future__ import annotations

# The 30 classes of the ACRV Probabilistic Object Detection challenge, with the
# challenge's spellings normalised to COCO names (tvmonitor -> television, ...).
ACVR_CLASSES: tuple[str, ...] = (
    "bottle", "cup", "knife", "bowl", "wine glass", "fork", "spoon", "banana",
    "apple", "orange", "cake", "potted plant", "mouse", "keyboard", "laptop",
    "cell phone", "book", "clock", "chair", "dining table", "couch", "bed",
    "toilet", "television", "microwave", "toaster", "refrigerator", "oven",
    "sink", "person",
)

# Spellings used by the challenge's label files (and VOC/COCO variants) -> canonical class.
CLASS_NAME_ALIASES: dict[str, str] = {
    "tv": "television",
    "tvmonitor": "television",
    "tv monitor": "television",
    "sofa": "couch",
    "diningtable": "dining table",
    "pottedplant": "potted plant",
    "cellphone": "cell phone",
    "wineglass": "wine glass",
    "fridge": "refrigerator",
    "laptop computer": "laptop",
}

# Caption words that name a class outright (coverage profit 1.0, CHAIR mentions).
# Keys are lower-case nouns as they appear after compound folding ("cell phone").
NOUN_SYNONYMS: dict[str, str] = {
    "mug": "cup", "cups": "cup", "mugs": "cup", "teacup": "cup",
    "bottles": "bottle", "flask": "bottle",
    "bowls": "bowl", "dish": "bowl",
    "knives": "knife", "forks": "fork", "spoons": "spoon",
    "glass": "wine glass", "wineglass": "wine glass",
    "bananas": "banana", "apples": "apple", "oranges": "orange",
    "cakes": "cake", "cupcake": "cake",
    "plant": "potted plant", "houseplant": "potted plant", "pot plant": "potted plant",
    "flower pot": "potted plant", "flowerpot": "potted plant",
    "mice": "mouse",
    "keyboards": "keyboard",
    "laptops": "laptop", "notebook computer": "laptop", "computer": "laptop",
    "phone": "cell phone", "cellphone": "cell phone", "smartphone": "cell phone",
    "mobile phone": "cell phone", "mobile": "cell phone", "phones": "cell phone",
    "books": "book", "novel": "book",
    "clocks": "clock", "alarm clock": "clock",
    "chairs": "chair", "stool": "chair",
    "table": "dining table", "tables": "dining table", "desk": "dining table",
    "sofa": "couch", "couches": "couch", "sofas": "couch",
    "beds": "bed",
    "toilets": "toilet",
    "tv": "television", "monitor": "television", "screen": "television",
    "televisions": "television",
    "microwaves": "microwave", "toasters": "toaster",
    "fridge": "refrigerator", "refrigerators": "refrigerator",
    "ovens": "oven", "stove": "oven",
    "sinks": "sink",
    "man": "person", "woman": "person", "people": "person", "boy": "person",
    "girl": "person", "child": "person", "persons": "person",
}


def canonical_class(name: str) -> str:
    """Normalise a label-file class name: lower-case, trimmed, aliases applied."""
    key = " ".join(str(name).strip().lower().replace("_", " ").split())
    return CLASS_NAME_ALIASES.get(key, key)


# How the challenge's own ground-truth loader names classes (rvchallenge-evaluation,
# class_list.py): a label-file name is lower-cased (nothing else) and looked up in its class
# list, where index 0 is `none` (background), or in these synonyms; any other name is dropped.
BACKGROUND_CLASS = "none"
CHALLENGE_SYNONYMS: dict[str, str] = {
    "tv": "television",
    "tvmonitor": "television",
    "computer monitor": "television",
    "stool": "chair",
    "sofa": "couch",
    "diningtable": "dining table",
    "pottedplant": "potted plant",
    "cellphone": "cell phone",
    "wineglass": "wine glass",
    "background": BACKGROUND_CLASS,
    "bg": BACKGROUND_CLASS,
    "__background__": BACKGROUND_CLASS,
}


def challenge_class(name: str) -> str | None:
    """The challenge's class for a label-file class name (`none` for background), or None for
    a name its loader does not know, whose instances it drops."""
    key = name.lower()
    if key == BACKGROUND_CLASS or key in ACVR_CLASSES:
        return key
    return CHALLENGE_SYNONYMS.get(key)
