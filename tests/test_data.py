"""Text sources through `datasets`: the built-in corpus, a file, a folder; windows of bytes."""

import pytest
import torch

from swarm.errors import SwarmError
from swarm.model.data import Windows, load_corpus, load_documents, load_text_units


def test_builtin_corpus_splits_by_article_with_a_fixed_seed():
    documents = load_documents(None)
    assert len(documents) > 9000
    corpus, again = load_corpus(None), load_corpus(None)
    assert torch.equal(corpus.validation, again.validation)
    share = len(corpus.validation) / (len(corpus.train) + len(corpus.validation))
    assert 0.07 < share < 0.13
    validation_text = bytes(corpus.validation[:2000].tolist()).decode("utf-8", errors="ignore")
    first_article = validation_text.split("\n\n")[0]
    assert first_article.encode() not in bytes(corpus.train.tolist())  # whole articles go to one side


def test_text_file_and_folder_take_the_same_path(tmp_path, text_file):
    from_file = load_corpus(str(text_file))
    assert len(from_file.train) > len(from_file.validation) > 0
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(5):
        (folder / f"{i}.txt").write_text(f"document number {i} " * 20)
    assert len(load_documents(str(folder))) == 5
    assert len(load_text_units(str(folder))) > 5 * 300


def test_missing_or_too_small_text_is_a_user_error(tmp_path):
    with pytest.raises(SwarmError, match="no such file"):
        load_corpus(str(tmp_path / "missing.txt"))
    one = tmp_path / "one.txt"
    one.write_text("just one paragraph")
    with pytest.raises(SwarmError, match="needs 2"):
        load_corpus(str(one))
    with pytest.raises(SwarmError, match="at least"):
        Windows(torch.zeros(10, dtype=torch.uint8), 96)


def test_fixed_windows_are_the_same_every_time():
    stream = torch.arange(1000, dtype=torch.int64).to(torch.uint8)
    windows = Windows(stream, 20)
    assert torch.equal(windows.fixed(8), windows.fixed(8))
    batch = windows.fixed(8)
    assert batch.shape == (8, 20) and batch.dtype == torch.int64
    assert ((batch[:, 1:] - batch[:, :-1]) % 256 == 1).all()  # consecutive bytes of the stream
