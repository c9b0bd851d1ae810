"""Chapter 12's comparison of "not" and the sentiment word in the same or in different halves,
made inside strata (template and length) so that the templates cannot stand in for the halves."""

from __future__ import annotations

import math

import pytest
import torch

from mha_lib.sentiment import NEGATION, NEGATIVE, POSITIVE, Example, make_datasets
from mha_lib.sentiment.probes import (
    TEMPLATES,
    halves_group,
    halves_groups,
    halves_strata,
    stratified_halves,
    template_of,
)

MOVIE, FIND, FILM = TEMPLATES  # "the movie was not good", "i did not find the plot boring", "not a good film"


def example(text: str) -> Example:
    """An Example from a sentence of the task (label from the word's polarity and "not")."""
    tokens = tuple(text.split())
    word = next(i for i, t in enumerate(tokens) if t in POSITIVE + NEGATIVE)
    negated = NEGATION in tokens
    return Example(tokens, int((tokens[word] in POSITIVE) != negated), negated, word,
                   tokens.index(NEGATION) if negated else None)


# Two strata that hold both groups: the same template and the same number of words.
FILM_SAME = example("not a good film in the end")  # n = 8: head 0 <cls> not a good
FILM_DIFFERENT = example("not a really good film to me")  # head 0 <cls> not a really
MOVIE_SAME = example("the long movie was not good in the end")  # n = 10: head 1 not good in the end
MOVIE_DIFFERENT = example("the movie was not really good in the end")  # head 0 ... not, head 1 really good ...


@pytest.fixture(scope="module")
def test_sentences() -> list[Example]:
    return make_datasets(300, 400, seed=3)[1]


def test_template_of_names_the_template():
    assert [template_of(example(s)) for s in (
        "the movie was not good", "this long plot seemed really dull overall",
        "i did not find the plot boring", "i found that script very clever to me",
        "not a good film", "an awful film", "a really good ending honestly")] == [
        MOVIE, MOVIE, FIND, FIND, FILM, FILM, FILM]
    with pytest.raises(ValueError, match="no template of the task starts with 'good'"):
        template_of(example("good"))


def test_template_of_agrees_with_where_the_templates_put_not(test_sentences):
    seen = {template_of(e) for e in test_sentences}
    assert seen == set(TEMPLATES)
    for e in test_sentences:
        if e.negated:  # "not" sits at word 0 in "not a good film", 2 in "i did not find", 3 or 4 otherwise
            assert e.negation_pos in {FILM: {0}, FIND: {2}, MOVIE: {3, 4}}[template_of(e)]


def test_the_confound_the_strata_remove(test_sentences):
    """Across the whole held-out set the halves follow the template: "i did not find" is always
    in different halves, "the movie was not good" almost always in the same half."""
    groups = halves_groups(test_sentences)
    templates = {g: [template_of(test_sentences[i]) for i in groups[g]] for g in ("same half", "different halves")}
    assert FIND not in templates["same half"]
    assert templates["same half"].count(MOVIE) > 0.8 * len(templates["same half"])
    assert templates["different halves"].count(MOVIE) < 0.1 * len(templates["different halves"])


def test_halves_strata(test_sentences):
    plain = example("a good film")
    strata = halves_strata([plain, FILM_SAME, MOVIE_DIFFERENT, FILM_DIFFERENT, MOVIE_SAME])
    assert strata == {(FILM, 7): {"same half": [1], "different halves": [3]},
                      (MOVIE, 9): {"same half": [4], "different halves": [2]}}
    assert halves_group(FILM_SAME) == halves_group(MOVIE_SAME) == "same half"

    strata = halves_strata(test_sentences)
    assert list(strata) == sorted(strata)
    indices = sorted(i for groups in strata.values() for idx in groups.values() for i in idx)
    assert indices == [i for i, e in enumerate(test_sentences) if e.negated]  # every negated one, once
    for (template, words), groups in strata.items():
        for name, idx in groups.items():
            assert all(template_of(test_sentences[i]) == template and len(test_sentences[i].tokens) == words
                       and halves_group(test_sentences[i]) == name for i in idx)


def test_stratified_halves_ignores_the_gap_between_templates():
    """A model right on every "i did not find ..." sentence (all in different halves) and wrong on
    every "the movie was not ..." one (mostly in the same half) shows a gap between the groups,
    but none inside a stratum."""
    examples = [example("i did not find the plot boring"), example("the movie was not good"),
                MOVIE_SAME, MOVIE_DIFFERENT]
    correct = [True, False, False, False]
    naive = {name: [correct[i] for i in idx] for name, idx in halves_groups(examples).items()}
    assert naive["different halves"].count(True) == 1 and naive["same half"].count(True) == 0
    result = stratified_halves([(correct, examples)])
    assert result == {"same half": 0.0, "different halves": 0.0, "gap": 0.0, "sentences": 2, "strata": 1}

    nothing = stratified_halves([(correct[:2], examples[:2])])  # no stratum holds both groups
    assert math.isnan(nothing["gap"]) and (nothing["sentences"], nothing["strata"]) == (0, 0)


def test_stratified_halves_weights_and_pools():
    """Each stratum weighs n_same * n_diff / (n_same + n_diff); runs are pooled stratum by stratum."""
    film = [FILM_SAME] * 3 + [FILM_DIFFERENT]  # weight 3 * 1 / 4 = 0.75
    movie = [MOVIE_SAME] * 2 + [MOVIE_DIFFERENT] * 2  # weight 2 * 2 / 4 = 1
    film_right = "1001"  # same half 1 of 3, different halves 1 of 1
    movie_right = [False, True, True, False]  # same half 1 of 2, different halves 1 of 2
    result = stratified_halves([(film_right + "".join("1" if c else "0" for c in movie_right), film + movie)])
    assert result["same half"] == pytest.approx((0.75 * 1 / 3 + 1 * 1 / 2) / 1.75)
    assert result["different halves"] == pytest.approx((0.75 * 1 + 1 * 1 / 2) / 1.75)
    assert result["gap"] == pytest.approx(result["different halves"] - result["same half"])
    assert (result["sentences"], result["strata"]) == (8, 2)

    # The same sentences as two runs: the same strata, so the same answer; a tensor works too.
    pooled = stratified_halves([(film_right, film), (torch.tensor(movie_right), movie)])
    assert pooled == pytest.approx(result)
    with pytest.raises(ValueError, match="correct has 3 entries for 4 examples"):
        stratified_halves([("101", film)])


def test_stratified_halves_on_the_task(test_sentences):
    strata = halves_strata(test_sentences)
    both = [g for g in strata.values() if g["same half"] and g["different halves"]]
    assert both, "the held-out set should hold a stratum with both groups"
    everything = stratified_halves([([True] * len(test_sentences), test_sentences)])
    assert (everything["same half"], everything["different halves"], everything["gap"]) == (1.0, 1.0, 0.0)
    assert everything["sentences"] == sum(len(i) for g in both for i in g.values())
    same_only = [halves_group(e) == "same half" for e in test_sentences]
    assert stratified_halves([(same_only, test_sentences)])["gap"] == -1.0
