"""The Python API: text from a model folder, or through a swarm's peers, in a few lines.

    import swarm

    model = swarm.load("demo/model")                      # a model folder (swarm-fetch, swarm-demo)
    print(model.generate("The history of", max_bytes=100))

    with swarm.connect("--swarm demo --initial-peers /ip4/1.2.3.4/tcp/31337/p2p/QmX...") as remote:
        print(remote.generate("The history of"))          # one pass through the peers per span
        model = remote.fetch("my-model")                  # the swarm's blocks, checked, into a folder

    with swarm.connect(join_line, run_blocks=[1]) as remote:  # block 1 computed here, its hosts never asked
        print(remote.generate("The history of"))

The commands are thin users of the same functions: `swarm-generate` (`Model.stream`,
`Swarm.stream`), `swarm-fetch` (`Swarm.fetch`). Options are those of `swarm-generate`; the join
line is the one `swarm-bootstrap` prints, as it is.
"""

from __future__ import annotations

import codecs
import logging
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swarm.errors import SwarmError
from swarm.model.checkpoint import LoadedModel, load_model_folder
from swarm.model.denoiser import ModelConfig
from swarm.model.families import local_runner
from swarm.model.generate import STEPS_PER_BLOCK, continue_text
from swarm.model.steps import DEFAULT_REVEAL, DEFAULT_TEMPERATURE, BlockRunner, Reveal, Sampling

if TYPE_CHECKING:
    from swarm.p2p.client import SwarmClient

logger = logging.getLogger(__name__)

MODEL_TIMEOUT_S = 15.0  # waiting for the swarm's model record


def decoded(spans: Iterable[bytes]) -> Iterator[str]:
    """Text from spans of bytes, a character split across two spans joined whole; bytes that are
    not UTF-8 become U+FFFD."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for span in spans:
        if text := decoder.decode(span):
            yield text
    if tail := decoder.decode(b"", final=True):
        yield tail


@dataclass
class Writer:
    """What writes text: a model's config and a runner of its blocks (here, or on the swarm's peers)."""

    config: ModelConfig
    run_block: BlockRunner

    def stream(self, prompt: str, max_bytes: int = 128, temperature: float = DEFAULT_TEMPERATURE,
               reveal: Reveal = DEFAULT_REVEAL, steps_per_block: int = STEPS_PER_BLOCK,
               seed: int = 0) -> Iterator[str]:  # fmt: skip
        """The continuation of `prompt`, piece by piece as each pass through the blocks writes it.

        Args:
            max_bytes: the longest continuation, in bytes of UTF-8.
            temperature: 0 takes the most likely unit; above 0 (the default: DEFAULT_TEMPERATURE), draws from
                the softened logits.
            reveal: which hidden units a masked step shows ("leftmost", the default; "confident", "random").
            steps_per_block: denoising steps of each block per span.
            seed: the same seed writes the same text, here or through the swarm.
        """
        if max_bytes < 1 or steps_per_block < 1:
            raise SwarmError("max_bytes and steps_per_block must be at least 1")
        try:
            sampling = Sampling(temperature, reveal)
        except ValueError as error:
            raise SwarmError(str(error)) from None
        spans = continue_text(self.run_block, self.config, prompt, max_bytes, steps_per_block, sampling, seed)
        return decoded(spans)

    def generate(self, prompt: str, **options) -> str:
        """The whole continuation of `prompt` as one string (options: `stream`'s)."""
        return "".join(self.stream(prompt, **options))


class Model(Writer):
    """A model folder in memory, writing here."""

    def __init__(self, loaded: LoadedModel, folder: Path):
        if loaded.kind == "autoregressive":
            raise SwarmError(f"{folder} holds an autoregressive baseline; load a blocks or end-to-end model")
        super().__init__(loaded.config, local_runner(loaded.denoiser_for_block, loaded.config))
        self.loaded, self.folder = loaded, folder

    @property
    def manifest(self) -> dict | None:
        """Each block's step, and from swarm-fetch who vouched for it and how it scored."""
        return self.loaded.manifest


def load(folder: str | Path) -> Model:
    """The model in a folder (config.json, model.safetensors, tokenizer.json, manifest.json)."""
    return Model(load_model_folder(Path(folder)), Path(folder))


@dataclass(frozen=True)
class JoinLine:
    """The options every command joins a swarm with (`swarm-bootstrap` prints them as one line)."""

    swarm: str
    initial_peers: list[str]
    creator: str | None = None

    @classmethod
    def parse(cls, line: str) -> JoinLine:
        """`--swarm S [--creator F] --initial-peers A [--initial-peers B ...]`; SwarmError otherwise."""
        words, values = shlex.split(line), {"--swarm": [], "--creator": [], "--initial-peers": []}
        if len(words) % 2:
            raise SwarmError(f"a join line is pairs of --option value, not {line!r}")
        for flag, value in zip(words[::2], words[1::2]):
            if flag not in values:
                raise SwarmError(f"a join line takes --swarm, --creator and --initial-peers, not {flag}")
            values[flag].append(value)
        if len(values["--swarm"]) > 1 or len(values["--creator"]) > 1 or not values["--initial-peers"]:
            raise SwarmError("a join line names one --swarm, at most one --creator and at least one --initial-peers")
        return cls(values["--swarm"][0] if values["--swarm"] else "demo", values["--initial-peers"],
                   values["--creator"][0] if values["--creator"] else None)  # fmt: skip


class Swarm(Writer):
    """A client of a swarm (a context manager): writes through its peers, fetches its model.

    `data`: the swarm's training text (None: the built-in corpus), whose held-out windows measure a
    checkpoint before its answers are used (in an open swarm, every one); `eval_text`: a text file or folder of
    the user's own whose windows join that measurement; `run_blocks`: blocks this client must be sure of, which it runs
    itself from their checkpoint's verified file instead of asking any host (each costs one download
    and the block's steps for every span, here: swarm/serving/cross_check.py)."""

    def __init__(self, client: SwarmClient, data: str | None = None, model_timeout: float = MODEL_TIMEOUT_S,
                 eval_text: str | None = None, run_blocks: Iterable[int] = ()):  # fmt: skip
        self.client, self.data, self.model_timeout, self.eval_text = client, data, model_timeout, eval_text
        self.run_blocks = frozenset(run_blocks)

    def __enter__(self) -> Swarm:
        from swarm.checkpoints.choice import SpotCheck
        from swarm.serving.remote import RemoteBlocks

        self.client.__enter__()
        try:
            config = self.client.wait_for_model(self.model_timeout)
            if outside := sorted(b for b in self.run_blocks if not 0 <= b < config.n_blocks):
                raise SwarmError(f"no block {outside} to run here: the model's blocks are 0 to {config.n_blocks - 1}")
            own = self.data is not None or self.eval_text is not None  # else the built-in corpus's, when needed
            spot_check = SpotCheck.from_source(self.data, config, eval_text=self.eval_text) if own else None
            self.runner = RemoteBlocks(self.client.directory, self.client.p2p, self.client.loop, config,
                                       spot_check=spot_check, witness=self.client.witness(),
                                       run_here=self.run_blocks)  # fmt: skip
        except BaseException:
            self.client.__exit__(None, None, None)
            raise
        super().__init__(config, self.runner)
        return self

    def __exit__(self, *exc) -> None:
        from swarm.p2p.directory import DHTUnavailable
        from swarm.p2p.ledger import publish

        try:  # the answers other keys confirmed, into the ledger (swarm/p2p/ledger.py)
            publish(self.client.directory, self.runner.witness, wait=True)
        except DHTUnavailable as error:
            logger.warning("the attestation of the answers checked was not stored: %s", error)
        finally:
            self.client.__exit__(*exc)

    def fetch(self, out: str | Path) -> Model:
        """The swarm's model, block by block as its hosts agree and a spot check on held-out windows
        of the swarm's text passes, into the folder `out`, loaded."""
        from swarm.checkpoints.assemble import assemble
        from swarm.checkpoints.choice import SpotCheck

        spot_check = SpotCheck.from_source(self.data, self.config, eval_text=self.eval_text)
        assemble(self.client, self.config, Path(out), spot_check)
        return load(out)


def connect(join_line: str, data: str | None = None, member_key: str | None = None,
            certificate: str | None = None, run_blocks: Iterable[int] = ()) -> Swarm:  # fmt: skip
    """A client of the swarm the join line names, to use in a `with` block. `data`: the swarm's
    training text (None: the built-in corpus); `member_key` and `certificate`: a member's, in a
    members-only swarm (swarm-bootstrap keygen and invite); `run_blocks`: blocks to run here, never
    asking their hosts (`Swarm`)."""
    from swarm.p2p.client import SwarmClient  # hivemind only for the swarm half of the API
    from swarm.p2p.members import load_credentials
    from swarm.p2p.network import NetworkOptions

    join = JoinLine.parse(join_line)
    if (member_key is None) != (certificate is None):
        raise SwarmError("member_key and certificate go together")
    credentials = load_credentials(member_key, certificate) if member_key else None
    client = SwarmClient(join.swarm, NetworkOptions(initial_peers=join.initial_peers), join.creator, credentials)
    return Swarm(client, data, run_blocks=run_blocks)


def fetch(join_line: str, out: str | Path, data: str | None = None) -> Model:
    """The swarm's model into the folder `out`, loaded: `connect`, then `Swarm.fetch`."""
    with connect(join_line, data) as remote:
        return remote.fetch(out)
