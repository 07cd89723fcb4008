"""The P2P handlers of live peers, as fuzz targets: a valid request for each, how a raw message is
sent to it, and what came back (tests/test_fuzz_peer.py, benchmarks/fuzz.py; the decoders of a
peer's bytes are fuzz.py's).

Every handler must answer any message within its timeout, with a reply (an error reply for a
request it refuses), and leave its peer answering the next valid request. `send` says what a
message got:
- `ANSWER` or `ERROR_REPLY` (a reply whose schema says it refused, a download stream the host
  closed without a reply, or an envelope hivemind could not parse: its error names protobuf's
  DecodeError before the handler runs);
- `RAISED`: the handler raised, and hivemind sent back the exception it caught (a crash of the
  handler, however the peer survived it), or the reply is not what the handler sends;
- `HANG`: no answer within the handler's timeout (each is the handler's own longest honest wait:
  a long poll's deadline, a dial-back's dials, a download's first byte, plus slack);
- `NOT_SENT`: our own daemon refused to send it (over libp2p's 4 MiB): not a message to count;
- `FAILED`: our end of the call broke otherwise (a connection reset): the caller asks whether the
  peer still answers.
A peer that no longer answers `rpc_info` (`answers`), or whose process has died, is a crash too;
benchmarks/fuzz.py also reads the peers' logs.

`fuzz_swarm` starts the peers: a bootstrap node (which serves the tokenizer) and one `swarm-peer`
per block of a small model of the built-in tokenizer, on 127.0.0.1, each also serving its stage
of the autoregressive pipeline, so that every handler of ours is live. Dial-backs go to 127.0.0.1,
to a port that nothing listens on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as Protobuf
from hivemind.compression import serialize_torch_tensor
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError, P2PHandlerError
from hivemind.proto import runtime_pb2

from swarm.checkpoints.framing import FramingError, read_frame
from swarm.checkpoints.transfer import DOWNLOAD, FIRST_BYTE_TIMEOUT_S, REPLY_BYTES, BlockServicer
from swarm.lab.launch import LocalSwarm, Started
from swarm.model.denoiser import ModelConfig
from swarm.model.families import family_of
from swarm.p2p import messages as m
from swarm.p2p.client import SwarmClient
from swarm.p2p.directory import Host
from swarm.p2p.info import InfoServicer
from swarm.p2p.reachability import DIAL_BACK_TIMEOUT_S, ReachabilityServicer
from swarm.p2p.tokenizer import TokenizerServicer
from swarm.serving.ar_pipeline import StageServicer
from swarm.serving.server import DenoiseServicer
from swarm.serving.wire import encode_request
from swarm.sync.transport import PayloadServicer
from swarm.waiting import wait_for

ANSWER, ERROR_REPLY, RAISED, HANG, NOT_SENT, FAILED = "answer", "error reply", "raised", "hang", "not sent", "failed"
ENVELOPE = "hivemind: the envelope does not parse"  # an error reply that no handler of ours saw
SLACK_S = 10.0  # beyond a handler's longest honest wait, before a call is counted as a hang
SYNC_DEADLINE_S = 2.0  # the peers' --sync-deadline: the longest a payload poll waits
# a small model of the built-in tokenizer (its peers serve `rpc_tokenizer` too)
MODEL = {"prefix_len": 16, "gen_len": 8, "d_model": 32, "n_heads": 2, "n_layers": 4, "n_blocks": 2}
PEER_OPTIONS = ["--max-steps", "4", "--save-every", "2", "--announce-period", "1", "--batch-size", "4",
                "--sync-deadline", str(SYNC_DEADLINE_S), "--serve-ar-stage"]  # fmt: skip
CORPUS = "A swarm of small computers trains one model together, block by block, and serves it.\n\n" * 200
START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Handler:
    """One handler of one peer: its name on the wire, a valid request, and how to read a reply."""

    name: str  # the method, e.g. "rpc_chunk_list"
    protocol: str
    request: Protobuf  # a valid request: what mutations start from
    refused: Callable[[Protobuf], bool]  # whether a reply says the request was refused
    timeout_s: float
    reply_type: type[Protobuf] = runtime_pb2.ExpertResponse
    stream: bool = False  # rpc_download: a stream of our own framing (transfer.py)

    def sample(self) -> bytes:
        """The valid request's bytes as sent: the message, or for a stream its frames and end mark."""
        request = self.request.SerializeToString()
        return frames(request) if self.stream else request


def frames(request: bytes) -> bytes:
    """A request's bytes and the end-of-stream mark after them, as hivemind frames a stream's messages."""

    def frame(marker: bytes, body: bytes) -> bytes:
        return marker + len(body).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + body

    return frame(P2P.MESSAGE_MARKER, request) + frame(P2P.ERROR_MARKER, b"")


def _refused_by(message: type[m.Message], refused: Callable[[m.Message], bool]) -> Callable[[Protobuf], bool]:
    """A reply's metadata read as `message`: refused if `refused` says so, or if it is an ErrorReply."""

    def check(reply: Protobuf) -> bool:
        try:
            return refused(message.decode(reply.metadata))
        except m.MessageError:
            m.ErrorReply.decode(reply.metadata)  # neither: not what the handler sends (MessageError)
            return True

    return check


def _info_refused(reply: runtime_pb2.ExpertInfo) -> bool:
    """`rpc_info` refuses nothing: its reply is a PeerInfo (MessageError if it is not)."""
    m.PeerInfo.decode(reply.serialized_info)
    return False


def _name(servicer: type, method: str) -> str:
    return servicer._get_handle_name(None, method)


def handlers(host: Host, config: ModelConfig, closed_port: int) -> list[Handler]:
    """Every handler of the peer of `host`'s record, each with a valid request for it."""
    block, checkpoint = host.block, host.announcement.checkpoint
    sha = checkpoint.sha256 if checkpoint else "0" * 64
    unary, computing = FIRST_BYTE_TIMEOUT_S + SLACK_S, 3 * SLACK_S
    return [
        Handler("rpc_info", _name(InfoServicer, "rpc_info"), runtime_pb2.ExpertUID(uid="info"), _info_refused, unary,
                runtime_pb2.ExpertInfo),
        Handler("rpc_chunk_list", _name(BlockServicer, "rpc_chunk_list"),
                _request(m.ChunkListRequest(block=block, sha256=sha)),
                _refused_by(m.ChunkListReply, lambda r: bool(r.error)), unary),
        Handler("rpc_download", _name(BlockServicer, DOWNLOAD),
                _request(m.DownloadRequest(block=block, sha256=sha, first_chunk=0, chunks=1)),
                _refused_by(m.DownloadHeader, lambda r: bool(r.error)), FIRST_BYTE_TIMEOUT_S + SLACK_S, stream=True),
        Handler("rpc_payload", _name(PayloadServicer, "rpc_payload"),
                _request(m.PayloadRequest(block=block, step=host.announcement.step)),
                _refused_by(m.PayloadReply, lambda r: r.status != "ok"), SYNC_DEADLINE_S + SLACK_S),
        Handler("rpc_denoise", _name(DenoiseServicer, "rpc_denoise"), denoise_request(config, block),
                _error_reply, computing),
        Handler("rpc_stage", _name(StageServicer, "rpc_stage"), stage_request(config, block), _error_reply,
                computing),
        Handler("rpc_tokenizer", _name(TokenizerServicer, "rpc_tokenizer"),
                _request(m.TokenizerRequest(sha256=config.tokenizer)),
                _refused_by(m.TokenizerReply, lambda r: bool(r.error)), unary),
        Handler("rpc_dial_back", _name(ReachabilityServicer, "rpc_dial_back"),
                _request(m.DialBackRequest(ports=[closed_port])), _refused_by(m.DialBackReply, lambda r: bool(r.error)),
                4 * DIAL_BACK_TIMEOUT_S + SLACK_S),
        Handler("rpc_dial_me", _name(ReachabilityServicer, "rpc_dial_me"), _request(m.DialMeRequest()),
                _refused_by(m.DialMeReply, lambda r: False), unary),
    ]  # fmt: skip


def _error_reply(reply: runtime_pb2.ExpertResponse) -> bool:
    """Whether a reply carries an ErrorReply in place of tensors (MessageError if its metadata is garbage)."""
    return m.refusal(reply) is not None


def _request(message: m.Message) -> runtime_pb2.ExpertRequest:
    return runtime_pb2.ExpertRequest(metadata=message.encode())


def denoise_request(config: ModelConfig, block: int) -> runtime_pb2.ExpertRequest:
    """A valid request to run `block` on two windows, all hidden, in two steps."""
    prefix = torch.zeros(2, config.prefix_len, dtype=torch.long)
    state = torch.full((2, config.gen_len), config.mask_id, dtype=torch.long)
    options = m.DenoiseRequest(block=block, logits=block == config.n_blocks - 1)
    return encode_request(options, prefix, state, family_of(config).schedule(block, 2))


def stage_request(config: ModelConfig, stage: int) -> runtime_pb2.ExpertRequest:
    """A valid request for stage `stage` of the autoregressive pipeline: units, or hidden states after."""
    x = torch.zeros(1, 4, dtype=torch.long) if stage == 0 else torch.zeros(1, 4, config.d_model)
    return runtime_pb2.ExpertRequest(metadata=m.StageRequest(stage=stage).encode(), tensors=[serialize_torch_tensor(x)])


async def send(p2p: P2P, peer_id: str, handler: Handler, data: bytes) -> tuple[str, str]:
    """Send raw `data` to `handler` of `peer_id`: (the outcome, what it was: an error's text or "")."""
    try:
        async with asyncio.timeout(handler.timeout_s):
            if handler.stream:
                reply = await _stream_reply(p2p, peer_id, handler, data)
            else:
                reply = await p2p._client.call_unary_handler(PeerID.from_base58(peer_id), handler.protocol, data)
    except TimeoutError:
        return HANG, f"no answer in {handler.timeout_s:.0f}s"
    except P2PHandlerError as error:  # hivemind's error reply: the envelope did not parse, or the handler raised
        return (ERROR_REPLY, ENVELOPE) if str(error).startswith("DecodeError") else (RAISED, str(error)[:300])
    except P2PDaemonError as error:
        return NOT_SENT, str(error)[:300]
    except Exception as error:  # noqa: BLE001 (our end broke, a connection reset: the caller asks if the peer lives)
        return FAILED, f"{type(error).__name__}: {str(error)[:300]}"
    if reply is None:
        return ERROR_REPLY, ""  # a stream closed without a reply: the host's refusal of a request it cannot read
    try:
        return (ERROR_REPLY if handler.refused(handler.reply_type.FromString(reply)) else ANSWER), ""
    except (DecodeError, m.MessageError) as error:
        return RAISED, f"a reply that is not the handler's: {error}"


async def _stream_reply(p2p: P2P, peer_id: str, handler: Handler, data: bytes) -> bytes | None:
    """The first reply on a new stream to `handler` after `data`; None if the host closes it first.
    An error frame is what hivemind sends for a handler that raised."""
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), handler.protocol)
    try:
        writer.write(data)
        await writer.drain()
        error, body = await read_frame(reader, REPLY_BYTES)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    except FramingError as failure:
        raise P2PHandlerError(f"a reply frame that is not one: {failure}") from None
    finally:
        writer.close()
    if error:
        raise P2PHandlerError(f"an error frame: {body[:200]!r}")
    return body


async def answers(p2p: P2P, peer_id: str, timeout: float = 10.0) -> bool:
    """Whether the peer answers a valid `rpc_info` with its `PeerInfo` within `timeout`."""
    stub = InfoServicer.get_stub(p2p, PeerID.from_base58(peer_id))
    try:
        reply = await stub.rpc_info(runtime_pb2.ExpertUID(uid="info"), timeout=timeout)
        m.PeerInfo.decode(reply.serialized_info)
        return True
    except Exception:  # noqa: BLE001 (no answer, or a broken one: either way it does not answer)
        return False


@dataclass
class Target:
    """A live peer to fuzz: its process, its record and its handlers."""

    process: Started
    host: Host
    handlers: list[Handler]


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def fuzz_swarm(workdir: Path, swarm: str = "fuzz") -> Iterator[tuple[LocalSwarm, SwarmClient, list[Target]]]:
    """A bootstrap node and one peer per block of `MODEL` (module docstring), serving; a client of
    it in this process; and each peer as a `Target`. Everything started is stopped on leaving."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "model.json").write_text(json.dumps(MODEL))
    (workdir / "corpus.txt").write_text(CORPUS)
    with LocalSwarm(
        workdir, swarm=swarm, config_path=str(workdir / "model.json"), data=str(workdir / "corpus.txt")
    ) as local:
        local.start_bootstrap(refresh_period=2)
        started = [local.start_peer(f"peer{b}", str(b), PEER_OPTIONS) for b in range(MODEL["n_blocks"])]
        with local.client() as client:
            config = client.wait_for_model(START_TIMEOUT_S)

            def serving() -> list[Host] | None:
                local.check_running()
                hosts = [[h for h in client.directory.hosts(b) if h.announcement.state == "serving"]
                         for b in range(config.n_blocks)]  # fmt: skip
                return [found[0] for found in hosts] if all(hosts) else None

            hosts = wait_for(serving, START_TIMEOUT_S, "every block's peer serving")
            port = closed_port()
            yield local, client, [Target(p, h, handlers(h, config, port)) for p, h in zip(started, hosts)]
