"""The readability figure: the share of whole written words that are words of the training text."""

import torch

from swarm.model.words import real_word_share, vocabulary, whole_words, words

TRAINING = "The river flows through the old city. Vitamin E is a nutrient, and I know it."


def known() -> frozenset[str]:
    return vocabulary(torch.tensor(list(TRAINING.encode())), min_count=1)


def test_words_are_split_on_whitespace_stripped_of_end_punctuation_and_lowercased():
    assert words("The city. (Old) river's") == ["the", "city", "old", "river's"]


def test_a_span_s_partial_first_and_last_words_are_left_out():
    assert whole_words(b"The riv", b"er flows through the ci") == ["flows", "through", "the"]
    assert whole_words(b"The river ", b"flows through ") == ["flows", "through"]


def test_single_letters_are_not_words_unless_a_or_i():
    vocabulary_ = known()
    assert "e" not in vocabulary_ and {"a", "i", "river"} <= vocabulary_
    junk = real_word_share([b"x "], [b"e e e e e e river "], vocabulary_)
    assert junk["share"] == 1 / 7


def test_the_share_counts_known_words_and_distinct_counts_repeats():
    vocabulary_ = known()
    real = real_word_share([b"x ", b"y "], [b"the old river flows ", b"the qzx city "], vocabulary_)
    assert real["words"] == 7 and real["share"] == 6 / 7 and real["distinct"] == 1.0
    looping = real_word_share([b"x "], [b"the the the the "], vocabulary_)
    assert looping["share"] == 1.0 and looping["distinct"] == 0.25


def test_a_word_counts_only_when_the_training_text_holds_it_often_enough():
    text = torch.tensor(list(("the river " * 5 + "han es tat ").encode()))
    assert vocabulary(text, min_count=5) == {"the", "river"}
    assert vocabulary(text, min_count=1) == {"the", "river", "han", "es", "tat"}
    soup = real_word_share([b"x "], [b"han the es tat river "], vocabulary(text, min_count=5))
    assert soup["share"] == 2 / 5
