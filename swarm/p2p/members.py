"""Members of an invite-only swarm: the certificates its creator signs, the proofs peers carry, the check.

Keys cost nothing, so in an open swarm counting keys is not counting people. A swarm created
with `swarm-bootstrap --new-swarm --members-only` says so in its model record, which the creator
signs and the join line pins: joiners learn it from the creator, and nobody else can turn it off.
In such a swarm a key counts only if the creator certified it: `swarm-bootstrap invite` signs a
`MemberCertificate` (records.py) naming the member's RSA public key (the key its DHT records
are signed with), a name and an expiry, with the creator's key.

A certificate alone is public: anyone who reads a member's record can copy it. So a peer carries
a `MemberProof`: the certificate and the certified key's signature over the peer id that carries
it. libp2p authenticates peer ids (the peer a call reaches, or comes from, holds that id's private
key), so a proof over the id of the peer we talk to shows that the member's key vouches for that
peer; copied onto another peer, it proves nothing.

`Membership.refusal` is the one check, shared by the directory (records, and so every vote,
replica list and host a reader counts) and by the services' gate (gate.py). It refuses a proof
whose certificate is for another swarm, not signed by the creator (forged), expired, revoked,
for another key than the one that signed the record, or whose peer-id signature is missing or
for another peer (replayed). Revocations are a creator-signed `RevocationList` under `S.revoked`
(directory.py reads it; the bootstrap re-publishes the creator's file of them).

Everything signed is msgpack of a list that starts with a tag naming what it is, so a signature
made for one purpose is never valid for another. Signing and checking are hivemind's RSA-PSS
(`hivemind.utils.crypto`), as for the DHT records.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey
from pydantic import ValidationError

from swarm.errors import SwarmError
from swarm.files import write_atomic
from swarm.p2p.network import load_key
from swarm.p2p.records import (
    MAX_REVOKED,
    BlockAnnouncement,
    MemberCertificate,
    MemberProof,
    RevocationList,
    check_swarm_name,
    read_model_file,
)

logger = logging.getLogger(__name__)

CERTIFICATE_TAG = "blockswarm member certificate v1"
PEER_TAG = "blockswarm member peer v1"
MAX_VALID_DAYS = 3650
DAY_S = 86400


def public_key_text(key: RSAPublicKey) -> str:
    """A public key as a certificate names it: OpenSSH text (`ssh-rsa AAAA...`)."""
    return key.to_bytes().decode()


def subkey_key_text(subkey: bytes) -> str | None:
    """The public key a DHT subkey (`[owner:ssh-rsa ...]`) carries, as text; None if it carries none."""
    found = RSASignatureValidator._PUBLIC_KEY_RE.search(subkey or b"")
    return found.group(1).decode(errors="replace") if found else None


def certificate_payload(certificate: MemberCertificate) -> bytes:
    """What the creator signs: every field but the signature, after a tag."""
    c = certificate
    return msgpack.packb([CERTIFICATE_TAG, c.swarm, c.name, c.member, c.issued, c.expires], use_bin_type=True)


def certificate_id(certificate: MemberCertificate) -> str:
    """The name a revocation gives a certificate: 128 bits of the sha256 of what was signed."""
    return hashlib.sha256(certificate_payload(certificate)).hexdigest()[:32]


def peer_payload(swarm: str, peer_id: str) -> bytes:
    """What a member's key signs to vouch for one of its peers."""
    return msgpack.packb([PEER_TAG, swarm, peer_id], use_bin_type=True)


def issue(creator: RSAPrivateKey, swarm: str, name: str, member: RSAPublicKey, valid_days: float,
          now: float | None = None) -> MemberCertificate:  # fmt: skip
    """A certificate for `member` as `name` in `swarm`, valid `valid_days` from now, signed by `creator`.

    SwarmError for a swarm name, member name or validity the certificate cannot hold."""
    check_swarm_name(swarm)
    if not 0 < valid_days <= MAX_VALID_DAYS:
        raise SwarmError(f"--valid-days must be more than 0 and at most {MAX_VALID_DAYS}, not {valid_days}")
    issued = int(time.time() if now is None else now)
    fields = dict(swarm=swarm, name=name, member=public_key_text(member), issued=issued,
                  expires=issued + int(valid_days * DAY_S), signature="A")  # fmt: skip
    try:
        unsigned = MemberCertificate.model_validate(fields)
    except ValidationError:
        raise SwarmError(f"--name {name!r} must be 1 to 64 printable characters") from None
    signature = creator.sign(certificate_payload(unsigned)).decode()
    return unsigned.model_copy(update={"signature": signature})


def prove(key: RSAPrivateKey, certificate: MemberCertificate, peer_id: str) -> MemberProof:
    """The proof a peer with id `peer_id` carries: its certificate and `key`'s signature over its id."""
    return MemberProof(certificate=certificate, signature=key.sign(peer_payload(certificate.swarm, peer_id)).decode())


@functools.lru_cache(maxsize=4096)
def _signatures_refusal(creator_key: str, proof: MemberProof, peer_id: str) -> str | None:
    """Why the signatures of a proof do not hold (None: they do). Cached: records are read again
    every announce period, and proofs are immutable."""
    certificate = proof.certificate
    try:
        creator = RSAPublicKey.from_bytes(creator_key.encode())
        member = RSAPublicKey.from_bytes(certificate.member.encode())
    except Exception:  # cryptography raises several types on a key that does not parse
        return "a key of the certificate does not parse"
    if not creator.verify(certificate_payload(certificate), certificate.signature.encode()):
        return "the certificate is not signed by the swarm's creator"
    if not member.verify(peer_payload(certificate.swarm, peer_id), proof.signature.encode()):
        return "the certified key did not sign this peer id"
    return None


class Membership:
    """One swarm's rule on who counts: its creator's key, whether only members count, what is revoked.

    Made open (everybody counts) and told the creator's terms when the model record is read
    (directory.py); a reader that never read the model record counts everybody. Shared by
    threads: each field is replaced whole, never changed in place."""

    def __init__(self, swarm: str):
        self.swarm = swarm
        self.members_only = False
        self.creator_key: str | None = None  # OpenSSH text of the key that wrote the model record
        self.revoked: frozenset[str] = frozenset()

    def set_terms(self, creator_subkey: bytes, members_only: bool) -> None:
        """The creator's terms, as its model record states them (under `creator_subkey`)."""
        self.creator_key, self.members_only = subkey_key_text(creator_subkey), members_only

    def set_revoked(self, revocations: RevocationList) -> None:
        self.revoked = frozenset(revocations.revoked)

    def refusal(self, proof: MemberProof | None, peer_id: str, owner: bytes | None = None,
                now: float | None = None) -> str | None:  # fmt: skip
        """Why the peer `peer_id` carrying `proof` is not a member (None: it is). `owner`: the
        subkey of the record the proof came in, whose key the certificate must name."""
        if proof is None:
            return "no member certificate"
        certificate = proof.certificate
        if certificate.swarm != self.swarm:
            return f"a certificate for swarm {certificate.swarm!r}, not {self.swarm!r}"
        if self.creator_key is None:
            return "the swarm's creator is not known yet"
        if owner is not None and subkey_key_text(owner) != certificate.member:
            return "the certificate names another key than the one that signed the record"
        refused = _signatures_refusal(self.creator_key, proof, peer_id)
        if refused:
            return refused
        if (time.time() if now is None else now) >= certificate.expires:
            return f"the certificate of {certificate.name!r} has expired"
        if certificate_id(certificate) in self.revoked:
            return f"the certificate of {certificate.name!r} was revoked"
        return None

    def admits(self, proof: MemberProof | None, peer_id: str, owner: bytes | None = None) -> bool:
        """Whether the peer counts: every peer in an open swarm; a member in a members-only one."""
        return not self.members_only or self.refusal(proof, peer_id, owner) is None

    def admits_record(self, announcement: BlockAnnouncement, owner: bytes) -> bool:
        """Whether a block record counts: its proof must vouch for the peer it names, and its
        certificate name the key that signed it (`owner`, the record's subkey)."""
        return self.admits(announcement.membership, announcement.peer_id, owner)


@dataclass(frozen=True)
class Credentials:
    """A member's key and its certificate: what `--member-key` and `--certificate` load."""

    key: RSAPrivateKey
    certificate: MemberCertificate

    def proof(self, peer_id: str) -> MemberProof:
        return prove(self.key, self.certificate, peer_id)


def load_credentials(key_path: str, certificate_path: str) -> Credentials:
    """A member's key and certificate; SwarmError if either does not read or they do not match."""
    key, certificate = load_key(key_path), read_certificate(certificate_path)
    if public_key_text(key.get_public_key()) != certificate.member:
        raise SwarmError(f"{certificate_path} certifies another key than the one in {key_path}")
    if certificate.expires <= time.time():
        raise SwarmError(f"the certificate in {certificate_path} expired: ask the swarm's creator for a new one")
    return Credentials(key, certificate)


def read_certificate(path: str | Path) -> MemberCertificate:
    """The certificate in a file `swarm-bootstrap invite` wrote; SwarmError if it is not one."""
    try:
        return MemberCertificate.model_validate_json(Path(path).read_bytes())
    except OSError as error:
        raise SwarmError(f"cannot read the certificate {path}: {error.strerror or error}") from None
    except ValidationError:
        raise SwarmError(f"{path} is not a member certificate (swarm-bootstrap invite writes them)") from None


def write_certificate(path: str | Path, certificate: MemberCertificate) -> None:
    write_atomic(Path(path), certificate.model_dump_json(indent=2).encode() + b"\n")


def read_public_key(path: str | Path) -> RSAPublicKey:
    """A member's public key: the `.pub` file `swarm-bootstrap keygen` writes beside the key (OpenSSH
    text), or the private key file itself; SwarmError if it is neither."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise SwarmError(f"cannot read the member key {path}: {error.strerror or error}") from None
    if data.startswith(b"ssh-rsa "):
        try:
            return RSAPublicKey.from_bytes(data.strip())
        except Exception:  # cryptography raises several types on a key that does not parse
            raise SwarmError(f"{path} is not an RSA public key") from None
    try:
        return load_key(path).get_public_key()
    except SwarmError:
        raise SwarmError(f"{path} is not a member key: give the .pub file 'swarm-bootstrap keygen' wrote") from None


def write_key_pair(path: str | Path) -> RSAPrivateKey:
    """A new member key in `path` (DER, readable by its owner only) and its public half in
    `path.pub`; SwarmError if `path` exists (a key in use is never overwritten)."""
    path = Path(path)
    if path.exists():
        raise SwarmError(f"{path} exists already: a key in use is never overwritten")
    key = RSAPrivateKey()
    write_atomic(path, key.to_bytes(), mode=0o600)
    write_atomic(path.with_name(path.name + ".pub"), key.get_public_key().to_bytes() + b"\n")
    return key


def read_revocations(path: str | Path) -> RevocationList:
    """The creator's file of revoked certificates (empty if there is none yet); SwarmError if it is not one."""
    return read_model_file(Path(path), RevocationList, "a list of revoked certificates") or RevocationList()


def revoke(path: str | Path, revoked_id: str, name: str = "") -> bool:
    """Add a certificate id to the creator's file of revocations (False if it was there already);
    SwarmError if the list is full. The file keeps each revoked certificate's name beside its id,
    for people; readers take the ids."""
    path = Path(path)
    revocations = read_revocations(path)
    if revoked_id in revocations.revoked:
        return False
    if len(revocations.revoked) >= MAX_REVOKED:
        raise SwarmError(f"{path} already names {MAX_REVOKED} certificates, as many as a revocation list may hold")
    try:
        names = json.loads(path.read_text()).get("names", {}) if path.exists() else {}
    except (OSError, ValueError, AttributeError):
        names = {}
    names = {**(names if isinstance(names, dict) else {}), revoked_id: name}
    text = json.dumps({"revoked": [*revocations.revoked, revoked_id], "names": names}, indent=2) + "\n"
    write_atomic(path, text.encode())
    return True
