"""Adopting unsigned entries: a person vouches for entries parked before signing was turned on,
and they are signed as they are.

Nothing here decodes a body to sign it: the bytes are signed as stored (``signed_again``).
Only the entries a person selects are adopted (parked before a time they name, of a breaker),
and the caller shows them (count and sample) and asks first. What a person is shown of a body
is decoded only where that is safe (JSON, msgpack) and is marked as unverified. The time a
selection goes by is the index's, which is not signed: it helps pick, it proves nothing.

A pickled body is never adopted: nobody can see what it holds without unpickling it, which
runs it, so a signature would vouch for bytes nobody has seen (and the drain then unpickles
them). Such entries are listed as refused; a person discards them, or reads them somewhere
safe and sends the task again by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .backout.codec import Codec, signed_again
from .backout.entry import ParkedTask
from .backout.envelope import Envelope, envelope_of
from .backout.masking import Masking
from .backout.store import BackoutStore, breaker_key
from .backout.trust import UNSIGNED
from .backout.walk import pages
from .config.trust import SAFE_SERIALIZERS
from .errors import UndecodableEntry

#: Entries read per round trip while looking for unsigned ones.
SCAN_BATCH = 500


#: Why a pickled body is not adopted (what a person reads).
PICKLED = (
    "a pickled body is never adopted: what it holds can't be seen without unpickling it. "
    "Discard it, or read its bytes somewhere safe and send the task again by hand"
)


@dataclass(frozen=True)
class Candidate:
    """An unsigned entry a person may adopt: what the store says of it, and what its body
    claims where it could be read safely (``claims``: ``None`` for a pickled body)."""

    entry: ParkedTask  # the store's placeholder: id, breaker, reason, parked_at, status
    envelope: Envelope
    claims: ParkedTask | None

    @property
    def refused(self) -> str | None:
        """Why it is not adopted (a pickled body), ``None`` when it may be."""
        return PICKLED if self.envelope.serializer not in SAFE_SERIALIZERS else None

    def summary(self, masking: Masking) -> str:
        """One line for a person: what the store says (status as stored), and what the body
        claims (reprs, its sensitive arguments masked as ``masking`` says, positional ones
        included)."""
        parked = f"parked_at={self.entry.parked_at:.0f} breaker={self.entry.breaker or '-'!r}"
        if self.claims is None:
            body = (
                f"{self.envelope.serializer} body of {len(self.envelope.body)} bytes, not decoded"
            )
        else:
            claims = self.claims
            args = masking.args(claims.task_name, claims.args)
            kwargs = masking.value(claims.kwargs)
            body = (
                f"claims {claims.task_name!r}[{claims.task_id!r}] args={args!r} kwargs={kwargs!r}"
            )
        said = f" (refused: {self.refused})" if self.refused else " (unverified)"
        return f"{self.entry.id} {parked} {self.entry.status}: {body}{said}"


@dataclass
class AdoptReport:
    """What an adoption did: entries signed, dead ``unsigned`` ones parked again, those that
    changed meanwhile (left unsigned) and those refused (pickled bodies, left unsigned)."""

    signed: int = 0
    revived: int = 0
    changed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def candidates(
    store: BackoutStore, before: float, breaker: str | None = None
) -> Iterator[Candidate]:
    """The unsigned entries parked before ``before`` (of ``breaker``, when named), never decoding
    a body that is not JSON or msgpack."""
    wanted = None if breaker is None else breaker_key(breaker)
    for page in pages(store, SCAN_BATCH):
        for entry_id, data in page:
            found = _candidate(store, entry_id, data)
            if found is None or found.entry.parked_at >= before:
                continue
            if wanted is not None and breaker_key(found.entry.breaker) != wanted:
                continue
            yield found


def _candidate(store: BackoutStore, entry_id: str, data: bytes) -> Candidate | None:
    try:
        envelope = envelope_of(data)
    except UndecodableEntry:  # undecodable, or held: not an unsigned entry
        return None
    if envelope.signature is not None:
        return None
    shown = store.get(entry_id)  # placeholder: the store signs, so the body is not decoded
    if shown is None:
        return None
    claims = None
    if envelope.serializer in SAFE_SERIALIZERS:
        try:
            claims = Codec(envelope.serializer).decode(data)
        except UndecodableEntry:
            claims = None
    return Candidate(shown, envelope, claims)


def adopt(
    store: BackoutStore,
    codec: Codec,
    chosen: list[Candidate],
    revive: Callable[[str], bool] | None = None,
) -> AdoptReport:
    """Sign each chosen entry's bytes as they are with ``codec``'s first key (a compare-and-set:
    an entry changed meanwhile is left alone and reported), and park again those a drain had
    quarantined as dead ``unsigned`` (``revive``). A pickled one is refused."""
    report = AdoptReport()
    for candidate in chosen:
        entry = candidate.entry
        if candidate.refused:
            report.refused.append(entry.id)
            continue
        data = store.payload(entry.id)
        if data is None or envelope_of(data) != candidate.envelope:
            report.changed.append(entry.id)
            continue
        if not store.rewrite(entry.id, data, signed_again(codec, candidate.envelope, entry.id)):
            report.changed.append(entry.id)
            continue
        report.signed += 1
        if entry.status == "dead" and entry.dead_reason == UNSIGNED and revive is not None:
            report.revived += int(revive(entry.id))
    return report
