"""Caption vocabulary (torch-free): tokenisation, word <-> id, special tokens.

Tokenisation follows the Karpathy-split convention: lower-case, punctuation stripped, split on
white space. Words seen fewer than `min_count` times map to <unk>.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from edgecap.errors import EdgecapError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
_PUNCT = re.compile(r"[^\w\s]")


def tokenize(text: str) -> list[str]:
    return _PUNCT.sub(" ", str(text).lower()).split()


def decode_ids(ids: Iterable[int], itos: list[str], pad_id: int, bos_id: int, eos_id: int) -> list[str]:
    """Token ids -> words: up to the first EOS, specials other than <unk> dropped. The one
    place tokens become text (a checkpoint's Vocab and a bundle's vocabulary both call it)."""
    words = []
    skip = {pad_id, bos_id}
    for i in ids:
        i = int(i)
        if i == eos_id:
            break
        if i not in skip:
            words.append(itos[i])
    return words


@dataclass
class Vocab:
    itos: list[str]
    specials: dict[str, str] = field(
        default_factory=lambda: {"pad": PAD, "bos": BOS, "eos": EOS, "unk": UNK}
    )

    def __post_init__(self):
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise EdgecapError("vocabulary has duplicate words")
        for role, word in self.specials.items():
            if word not in self.stoi:
                raise EdgecapError(f"vocabulary lacks its {role} token {word!r}")

    @classmethod
    def build(cls, captions: Iterable[list[str]], min_count: int = 5) -> Vocab:
        counts = Counter(w for tokens in captions for w in tokens)
        words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls([PAD, BOS, EOS, UNK] + [w for w in words if w not in (PAD, BOS, EOS, UNK)])

    def __len__(self) -> int:
        return len(self.itos)

    def id_of(self, role: str) -> int:
        return self.stoi[self.specials[role]]

    @property
    def pad_id(self) -> int:
        return self.id_of("pad")

    @property
    def bos_id(self) -> int:
        return self.id_of("bos")

    @property
    def eos_id(self) -> int:
        return self.id_of("eos")

    @property
    def unk_id(self) -> int:
        return self.id_of("unk")

    def encode(self, tokens: list[str], max_len: int) -> list[int]:
        """[BOS, w1..wn, EOS] truncated so the caption (with EOS) fits `max_len` outputs."""
        unk = self.unk_id
        ids = [self.stoi.get(w, unk) for w in tokens][: max_len - 1]
        return [self.bos_id, *ids, self.eos_id]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return decode_ids(ids, self.itos, self.pad_id, self.bos_id, self.eos_id)

    def to_dict(self) -> dict:
        return {"itos": list(self.itos), "specials": dict(self.specials)}

    @classmethod
    def from_dict(cls, data: dict, where: str = "vocabulary") -> Vocab:
        try:
            itos = list(data["itos"])
            specials = dict(data.get("specials") or {"pad": PAD, "bos": BOS, "eos": EOS, "unk": UNK})
        except (KeyError, TypeError) as exc:
            raise EdgecapError(f"{where}: expected {{'itos': [...], 'specials': {{...}}}}, got {type(data).__name__}") from exc
        return cls(itos, specials)
