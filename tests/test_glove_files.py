"""`--glove FILE` as the GloVe and word2vec tools ship it, not as edgecap would write it.

glove.6B.*.txt is `word v1 ... vd`; gensim's glove2word2vec adds a "count dim" header;
glove.840B.300d.txt holds words with spaces (the vector is the LAST d fields), repeated words
and bytes that are not UTF-8; downloads come gzipped or zipped.
"""

import bz2
import gzip
import zipfile

import numpy as np
import pytest

from edgecap.errors import EdgecapError
from edgecap.metrics.glove import load_glove

PLATE, BOWL, CHAIR = (0.8, 0, 0.6), (1, 0, 0), (0, 0, 1)


def line(word: str, vec) -> bytes:
    return (word + " " + " ".join(f"{x:.6f}" for x in vec) + "\n").encode()


BODY = line("bowl", BOWL) + line("plate", PLATE) + line("chair", CHAIR)


def load(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    load_glove.cache_clear()
    try:
        return load_glove(str(path), str(tmp_path / "cache"))
    finally:
        load_glove.cache_clear()


def cosine(glove, a: str, b: str) -> float:
    return float(glove.vector(a) @ glove.vector(b))


@pytest.mark.parametrize("name, data", [
    ("w2v.txt", b"3 3\n" + BODY),
    ("glove.6B.3d.txt.gz", gzip.compress(BODY)),
    ("glove.txt.bz2", bz2.compress(BODY)),
    ("crlf.txt", BODY.replace(b"\n", b"\r\n")),
], ids=["word2vec-header", "gzip", "bz2", "crlf"])
def test_header_compressed_and_crlf_files_read_like_the_plain_one(tmp_path, name, data):
    glove = load(tmp_path, name, data)
    assert glove.words() == ["bowl", "plate", "chair"] and glove.dim == 3
    assert cosine(glove, "plate", "bowl") == pytest.approx(0.8, abs=1e-5)


def test_one_file_zip_is_read_and_a_many_file_zip_is_refused(tmp_path):
    one = tmp_path / "glove.840B.3d.zip"
    with zipfile.ZipFile(one, "w") as zf:
        zf.writestr("glove.840B.3d.txt", BODY)
    load_glove.cache_clear()
    assert cosine(load_glove(str(one), str(tmp_path / "cache")), "plate", "chair") == pytest.approx(0.6, abs=1e-5)
    many = tmp_path / "glove.6B.zip"
    with zipfile.ZipFile(many, "w") as zf:
        zf.writestr("glove.6B.50d.txt", BODY)
        zf.writestr("glove.6B.100d.txt", BODY)
    load_glove.cache_clear()
    with pytest.raises(EdgecapError, match=r"glove.6B.zip: a zip of 2 files \(glove.6B.50d.txt, glove.6B.100d.txt\)"):
        load_glove(str(many), str(tmp_path / "cache"))


def test_840b_words_with_spaces_take_the_last_d_fields(tmp_path):
    data = line("bowl", BOWL) + line(". . .", CHAIR) + line("at name@domain.com", PLATE) + line("plate", PLATE)
    glove = load(tmp_path, "glove.840B.3d.txt", data)
    assert glove.words() == ["bowl", ". . .", "at name@domain.com", "plate"]
    assert cosine(glove, "at name@domain.com", "bowl") == pytest.approx(0.8, abs=1e-5)
    # a short numeric part is part of a word ("1 1/2", "2 0"); a run of numbers is a longer vector
    glove = load(tmp_path, "num.txt", line("bowl", BOWL) + line("2 0", PLATE))
    assert glove.words() == ["bowl", "2 0"]
    # a 9-d line in a 3-d file (two GloVe files concatenated)
    with pytest.raises(EdgecapError, match=r"mixed.txt:2: 9 numbers after 'plate', expected 3"):
        load(tmp_path, "mixed.txt", line("bowl", BOWL) + line("plate", (*PLATE, *PLATE, *PLATE)))


def test_repeated_and_non_utf8_words_are_skipped_and_counted(tmp_path, capsys):
    data = BODY + line("plate", (0, 1, 0)) + "caf\xe9".encode("latin-1") + b" 0 1 0\n"
    glove = load(tmp_path, "840B.txt", data)
    assert glove.words() == ["bowl", "plate", "chair"]
    # the first, most frequent, entry wins (gensim's rule), not the later one
    assert cosine(glove, "plate", "bowl") == pytest.approx(0.8, abs=1e-5)
    assert "840B.txt: 3 words read, lines skipped: 1 not UTF-8, 1 repeated" in capsys.readouterr().err


def test_cached_table_keeps_words_holding_a_carriage_return(tmp_path):
    data = BODY + line("a\rb", (0, 1, 0)) + line("cup", (0, 1, 0))
    first = load(tmp_path, "cr.txt", data)
    again = load(tmp_path, "cr.txt", data)  # from the .npy cache this time
    assert list((tmp_path / "cache").glob("cr.txt.*.npy"))
    assert again.words() == first.words() == ["bowl", "plate", "chair", "a\rb", "cup"]
    assert np.allclose(again.vector("cup"), (0, 1, 0))


def test_binary_word2vec_file_is_named_as_such(tmp_path):
    """GoogleNews-vectors-negative300.bin: a text header, then each word and its raw float32s."""
    rows = [("bowl", BOWL), ("plate", PLATE)]
    data = b"2 3\n" + b"".join(w.encode() + b" " + np.asarray(v, np.float32).tobytes() for w, v in rows)
    with pytest.raises(EdgecapError, match=r"w2v.bin:2: .*; not a word2vec text file; a binary one \(.bin\) "
                                           r"is not read: save it as text"):
        load(tmp_path, "w2v.bin", data)
