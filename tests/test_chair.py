"""CHAIR-i / CHAIR-s on hand-counted captions."""

import json

import pytest

from edgecap.errors import EdgecapError
from edgecap.metrics.chair import Chair, load_coco_instances, summarize


@pytest.fixture(scope="module")
def chair():
    return Chair()


def test_mentions_fold_phrases_plurals_and_synonyms(chair):
    assert chair.mentions("A man eating a hot dog next to two dogs.") == [
        ("man", "person"), ("hot dog", "hot dog"), ("dog", "dog")]
    assert chair.mentions("cell phones and wine glasses on the dining table") == [
        ("cell phone", "cell phone"), ("wine glass", "wine glass"), ("dining table", "dining table")]
    assert chair.mentions("a baby elephant near a toilet seat") == [
        ("elephant", "elephant"), ("toilet", "toilet")]
    assert chair.mentions("Knives and a mug on a sofa") == [
        ("knife", "knife"), ("mug", "cup"), ("sofa", "couch")]
    assert chair.mentions("nothing to see here") == []


def test_chair_counts(chair):
    results = [
        chair.score("a mug and a laptop on a desk", {"cup", "laptop", "dining table"}),  # 0 / 3
        chair.score("a dog next to a cup and a dog", {"cup"}),                         # 2 / 3
        chair.score("an empty room", {"chair"}),                                       # 0 / 0
        chair.score("a knife and a spoon", {"knife"}),                                 # 1 / 2
    ]
    assert results[1].hallucinated == [("dog", "dog"), ("dog", "dog")]
    assert results[1].chair_i == pytest.approx(2 / 3)
    summary = summarize(results)
    assert summary["CHAIR-i"] == pytest.approx(3 / 8)
    assert summary["CHAIR-s"] == pytest.approx(2 / 4)
    assert summary["mentions"] == 8 and summary["hallucinated_mentions"] == 3
    assert summary["captions_without_mentions"] == 1
    assert results[3].to_json()["chair_s"] == 1


def test_acvr_vocabulary_only(chair):
    acvr = Chair(classes=("cup", "laptop"))
    assert acvr.mentions("a dog and a mug") == [("mug", "cup")]


def test_coco_instances(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({
        "images": [{"id": 1}, {"id": 2}],
        "categories": [{"id": 62, "name": "chair"}, {"id": 72, "name": "tv"}],
        "annotations": [{"image_id": 1, "category_id": 62}, {"image_id": 1, "category_id": 72}],
    }))
    assert load_coco_instances(path)[0] == {"1": {"chair", "television"}, "2": set()}
    path.write_text(json.dumps({"categories": [], "annotations": [{"image_id": 1, "category_id": 3}]}))
    with pytest.raises(EdgecapError, match=r"annotations\[0\]"):
        load_coco_instances(path)


def test_chair_on_coco_resolves_ids_as_other_code_writes_them(tmp_path, capsys):
    """instances_val2014.json as COCO ships it, results keyed by int, zero-padded string (a COCO
    2017 file stem) and file name: all three images are scored, none is "unknown"."""
    from edgecap.cli import main

    instances = tmp_path / "instances_val2014.json"
    instances.write_text(json.dumps({
        "info": {}, "licenses": [],
        "images": [{"id": 391895, "file_name": "COCO_val2014_000000391895.jpg"},
                   {"id": 522418, "file_name": "COCO_val2014_000000522418.jpg"},
                   {"id": 184613, "file_name": "COCO_val2014_000000184613.jpg"}],
        "categories": [{"supercategory": "person", "id": 1, "name": "person"},
                       {"supercategory": "food", "id": 61, "name": "cake"}],
        "annotations": [{"image_id": 391895, "category_id": 1, "iscrowd": 0, "bbox": [0, 0, 5, 5], "id": 1},
                        {"image_id": 522418, "category_id": 61, "iscrowd": 1, "bbox": [0, 0, 5, 5], "id": 2},
                        {"image_id": 184613, "category_id": 1, "iscrowd": 0, "bbox": [0, 0, 5, 5], "id": 3}]}))
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 391895, "caption": "a man on a road"},
                                   {"image_id": "000000522418", "caption": "a cake next to a dog"},
                                   {"image_id": "COCO_val2014_000000184613.jpg", "caption": "a child"}]))
    assert main(["eval", "chair", "--captions", str(results), "--instances", str(instances),
                 "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "chair.json").read_text())["files"]["results"]["summary"]
    # man, child: person (in view); cake (in view); dog: hallucinated in 1 of 3 captions
    assert (summary["captions"], summary["mentions"], summary["hallucinated_mentions"]) == (3, 4, 1)
    assert summary["unknown_image_ids"] == 0


def test_the_paper_codes_tokenising_and_double_word_rules(chair):
    """Rules of the paper's code (LisaAnne/Hallucination utils/chair.py), with the built-in table."""
    assert chair.mentions("a man's dog") == [("man", "person"), ("dog", "dog")]  # was: no mention
    assert chair.mentions("a hot-dog stand") == []  # one token, as nltk.word_tokenize keeps it
    assert chair.mentions("a passenger train on the train tracks") == [("train", "train")]
    assert chair.mentions("a batter at home plate") == []
    assert chair.mentions("a baby elephants and adult giraffes") == [("elephant", "elephant"), ("giraffe", "giraffe")]
    seat = Chair(synonyms={"seat": "chair"})
    assert seat.mentions("the seat of the toilet") == [("toilet", "toilet")]
    assert seat.mentions("the seat by the window") == [("seat", "chair")]


# data/synonyms.txt's format: class first, then its synonyms, ", " between; the paper's file has
# entries after a double space (" motor bike") that its code never matches
SYNONYMS = """person, girl, boy, man, woman, mother, baby, passenger
dog, puppy
cat, kitten
chair, seat, stool
toilet, urinal
motorcycle, scooter,  motor bike, motorbike
bicycle, bike
train, locomotive
tv, monitor, television
dining table, table, desk
"""


def test_a_synonyms_file_in_the_papers_format_gives_the_papers_mentions(tmp_path):
    path = tmp_path / "synonyms.txt"
    path.write_text(SYNONYMS)
    chair = Chair.from_synonyms_file(path)
    assert chair.classes == ("person", "dog", "cat", "chair", "toilet", "motorcycle", "bicycle", "train",
                             "tv", "dining table")
    # mentions worked by hand through utils/chair.py's caption_to_words
    cases = {
        "A man's dog sits on a motor bike": ["person", "dog"],     # "motor bike" merges, then matches nothing
        "a mother cat with two kittens": ["person", "cat", "cat"],  # no qualifier rule for "mother"
        "a baby girl holds a baby dog": ["person", "person", "dog"],
        "the seat of the toilet next to a stool": ["toilet", "chair"],
        "a passenger train on the train tracks": ["train"],
        "a laptop on a desk near the television": ["dining table", "tv"],
        "a glass of wine next to a plant": [],
        "two men, three women and their children": ["person", "person"],  # irregular plurals ("children" unlisted)
    }
    for caption, classes in cases.items():
        assert [c for _, c in chair.mentions(caption)] == classes, caption
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(EdgecapError, match="no classes"):
        Chair.from_synonyms_file(tmp_path / "empty.txt")


def test_eval_chair_reads_the_papers_synonyms_file(tmp_path, run_cli):
    (tmp_path / "synonyms.txt").write_text(SYNONYMS)
    instances = tmp_path / "instances_val2014.json"
    instances.write_text(json.dumps({
        "images": [{"id": 1}, {"id": 2}],
        "categories": [{"id": 1, "name": "person"}, {"id": 72, "name": "tv"}, {"id": 67, "name": "dining table"}],
        "annotations": [{"image_id": 1, "category_id": 1}, {"image_id": 1, "category_id": 72},
                        {"image_id": 2, "category_id": 67}]}))
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "caption": "a woman watching television"},
                                   {"image_id": 2, "caption": "a cat on a table next to a glass"}]))
    code, out, err = run_cli("eval", "chair", "--captions", results, "--instances", instances,
                             "--synonyms", tmp_path / "synonyms.txt", "--out", tmp_path / "report")
    assert code == 0, err
    summary = json.loads((tmp_path / "report" / "chair.json").read_text())["files"]["results"]["summary"]
    # woman (person), television (tv: "tv" in instances maps to the file's class), cat
    # (hallucinated), table (dining table); "glass" is no object in this table
    assert (summary["mentions"], summary["hallucinated_mentions"], summary["captions_with_hallucination"]) == (4, 1, 1)
    code, _, err = run_cli("eval", "chair", "--captions", results, "--instances", instances,
                           "--synonyms", tmp_path / "missing.txt")
    assert code != 0 and "missing.txt" in err
