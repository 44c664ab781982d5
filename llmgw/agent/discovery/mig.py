"""NVIDIA MIG (Multi-Instance GPU) devices read from nvidia-smi output: a pure parser, no IO.

Two sources, each partial, so both are read and can be joined:

- ``parse_smi_list`` reads ``nvidia-smi -L``: one ``GPU N: NAME (UUID: GPU-...)`` line per
  card and, indented under it, one ``MIG <profile> Device <n>: (UUID: ...)`` line per MIG
  device. It gives the MIG UUID and the profile name, never the memory. Two UUID forms
  exist: ``MIG-<uuid>`` (drivers from R470 on) and, before that (R450/R460),
  ``MIG-GPU-<card uuid>/<gpu instance id>/<compute instance id>``, from which the
  GPU- and compute-instance ids are taken. Lines it does not know are skipped.
- ``parse_mig_xml`` reads ``nvidia-smi -q -x``: per card, its ``<mig_devices>`` entries
  with the MIG device index, the GPU- and compute-instance ids and the memory. The XML
  carries neither the MIG UUID nor the profile name (checked on driver 535, v12 DTD;
  the 590 ``-q`` text has no such field either), so those are None there.
  ``mig_enabled_cards`` reads ``mig_mode/current_mig`` of the same text, which tells a
  card in MIG mode with no instance carved (True, and no instances) from a card not in
  MIG mode (False).
- ``merge_instances`` joins the two on (card UUID, MIG device index).
- ``cuda_visible_devices`` is what an engine placed on cards is given: a MIG device's
  UUID through ``mig_cuda_visible``, and one MIG device alone, as CUDA allows.

Figures nvidia-smi does not give are None, never 0 (the "no figure" words are those of
``smixml``). XML declaring entities or a DOCTYPE internal subset is refused with
``MigXmlError`` (a ``SmiXmlError``, so a ValueError), as ``smixml`` does.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llmgw.agent.discovery.smixml import SmiXmlError, _bytes, _int, _text, smi_root

_GPU_LINE = re.compile(
    r"^GPU\s+(?P<index>\d+):\s+(?P<name>.+?)\s+\(UUID:\s*(?P<uuid>GPU-[^\s)]+)\)$"
)
_MIG_LINE = re.compile(
    r"^MIG\s+(?P<profile>\S+)\s+Device\s+(?P<index>\d+):\s+\(UUID:\s*(?P<uuid>MIG-[^\s)]+)\)$"
)
# Drivers before R470: MIG-GPU-<card uuid>/<gi>/<ci>.
_LEGACY_UUID = re.compile(r"^MIG-(?P<parent>GPU-[^/\s]+)/(?P<gi>\d+)/(?P<ci>\d+)$")
# A card family: A100, A30, H100, H200, H20, H800, GH200, GB200, B200, L40S...
_FAMILY = re.compile(r"^[A-Z]{1,3}\d{1,4}[A-Z]{0,3}$", re.IGNORECASE)
_NAME_GB = re.compile(r"(?<![\d.])(\d{1,4})\s*GB\b", re.IGNORECASE)
_VENDOR_WORDS = {"nvidia", "tesla"}
# Memory sizes (GB) cards are sold with; a reported size snaps to the nearest one when
# it lies within 8 % below (ECC and firmware reservations) to 2 % above it.
_MARKETING_GB = (10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 141, 144, 180, 186, 192, 288)
_GIB = 1 << 30


class MigXmlError(SmiXmlError):
    """The text is not an ``nvidia-smi -q -x`` log we are willing to read for MIG."""


@dataclass(frozen=True)
class MigInstance:
    """One MIG device on a card; None wherever the source did not say.

    ``uuid`` is the MIG UUID as nvidia-smi -L prints it (``MIG-<uuid>`` or the pre-R470
    ``MIG-GPU-<card uuid>/<gi>/<ci>``); None when read from the XML alone.
    ``memory_total`` is in bytes. ``device_index`` is the MIG device's index on its card
    (``Device N`` in -L, ``<index>`` in the XML).
    """

    parent_uuid: str
    parent_index: int
    uuid: str | None
    gi_id: int | None
    ci_id: int | None
    profile: str | None
    memory_total: int | None
    device_index: int | None

    def class_name(self, card_name: str, card_memory: int | None) -> str:
        """A device class such as ``a100-80g-mig-3g.40gb``: family, card size, profile.

        The rule:

        - Family: the product name with a leading "NVIDIA"/"Tesla" dropped; its first word
          (split at spaces and hyphens) when that looks like a model number (letters then
          digits then at most three letters: A100, H100, H200, GH200, GB200, B200, A30,
          L40S), lowercased. Otherwise the whole remaining name without its "<n>GB" words,
          lowercased, every run of other characters than a-z and 0-9 made one "-"
          ("geforce-rtx-4090"); "gpu" if nothing is left.
        - Size: ``card_memory`` (bytes of the whole card) in GiB, snapped to the nearest
          size cards are sold with (80, 94, 96, 141, 40, 24, 48, 186...) when within 8 %
          below to 2 % above it, else rounded to a whole number: 81559 MiB -> 80,
          143771 MiB (H200) -> 141, 95830 MiB (H100 NVL) -> 94. Without ``card_memory``,
          the "<n>GB" the name states ("A100-SXM4-80GB" -> 80); without either, the
          size part is left out (``h200-mig-1g.18gb``).
        - Then ``-mig-`` and the profile lowercased, characters other than a-z, 0-9 and
          "." made "-" ("1g.10gb+me" -> "1g.10gb-me"); "unknown" when there is none.
        """
        parts = [_family(card_name)]
        size = _size_gb(card_name, card_memory)
        if size is not None:
            parts.append(f"{size}g")
        profile = _slug(self.profile or "", keep=".") or "unknown"
        parts += ["mig", profile]
        return "-".join(parts)


@dataclass(frozen=True)
class ListedCard:
    """One ``GPU N:`` line of ``nvidia-smi -L`` and the MIG devices listed under it."""

    index: int
    name: str
    uuid: str
    instances: tuple[MigInstance, ...]


def _slug(text: str, keep: str = "") -> str:
    allowed = "a-z0-9" + re.escape(keep)
    return re.sub(f"[^{allowed}]+", "-", text.lower()).strip("-")


def _model_words(card_name: str) -> list[str]:
    words = card_name.split()
    while words and words[0].lower() in _VENDOR_WORDS:
        words = words[1:]
    return words


def _family(card_name: str) -> str:
    words = _model_words(card_name)
    first = re.split(r"[-\s]+", words[0])[0] if words else ""
    if _FAMILY.match(first):
        return first.lower()
    return _slug(_NAME_GB.sub(" ", " ".join(words))) or "gpu"


def _size_gb(card_name: str, card_memory: int | None) -> int | None:
    if card_memory is not None and card_memory > 0:
        gib = card_memory / _GIB
        near = [s for s in _MARKETING_GB if 0.92 * s <= gib <= 1.02 * s]
        if near:
            return min(near, key=lambda s: abs(gib - s))
        return max(1, round(gib))
    m = _NAME_GB.search(card_name)
    return int(m[1]) if m else None


def parse_smi_list(text: str) -> list[ListedCard]:
    """The cards and MIG devices in ``nvidia-smi -L`` output, in the order listed.

    A ``MIG`` line before any ``GPU`` line, one whose pre-R470 UUID names another card
    than the one it is listed under, and any line of another shape are skipped; text
    without a ``GPU N:`` line gives [].
    """
    cards: list[ListedCard] = []
    for raw in text.splitlines():
        line = raw.strip()
        gpu = _GPU_LINE.match(line)
        if gpu is not None:
            cards.append(ListedCard(int(gpu["index"]), gpu["name"], gpu["uuid"], ()))
            continue
        mig = _MIG_LINE.match(line)
        if mig is None or not cards:
            continue
        card = cards[-1]
        uuid = mig["uuid"]
        gi_id = ci_id = None
        legacy = _LEGACY_UUID.match(uuid)
        if legacy is not None:
            if legacy["parent"] != card.uuid:
                continue
            gi_id, ci_id = int(legacy["gi"]), int(legacy["ci"])
        instance = MigInstance(
            parent_uuid=card.uuid,
            parent_index=card.index,
            uuid=uuid,
            gi_id=gi_id,
            ci_id=ci_id,
            profile=mig["profile"],
            memory_total=None,
            device_index=int(mig["index"]),
        )
        cards[-1] = replace(card, instances=(*card.instances, instance))
    return cards


def _root(text: str) -> ET.Element:
    return smi_root(text, MigXmlError)


def parse_mig_xml(text: str) -> dict[str, list[MigInstance]]:
    """Per card UUID, the MIG devices ``nvidia-smi -q -x`` lists, in file order.

    Every ``<gpu>`` with a UUID has a key; a card without MIG devices (MIG off, or on
    with none carved: ask ``mig_enabled_cards``) maps to []. ``uuid`` and ``profile``
    are None (the XML carries neither); ``memory_total`` is ``fb_memory_usage/total``.
    ``parent_index`` is the card's position in the log, which is nvidia-smi's index when
    the log covers all cards (the same number ``-L`` prints); ``minor_number`` is not
    used, as it can differ. Raises ``MigXmlError`` for text it refuses.
    """
    found: dict[str, list[MigInstance]] = {}
    for position, gpu in enumerate(_root(text).findall("gpu")):
        card_uuid = _text(gpu, "uuid")
        if card_uuid is None:
            continue
        found[card_uuid] = [
            MigInstance(
                parent_uuid=card_uuid,
                parent_index=position,
                uuid=None,
                gi_id=_int(device, "gpu_instance_id"),
                ci_id=_int(device, "compute_instance_id"),
                profile=None,
                memory_total=_bytes(device, "fb_memory_usage/total"),
                device_index=_int(device, "index"),
            )
            for device in gpu.findall("mig_devices/mig_device")
        ]
    return found


def mig_enabled_cards(text: str) -> dict[str, bool]:
    """Per card UUID in ``nvidia-smi -q -x``, whether MIG mode is on now.

    True only for ``mig_mode/current_mig`` "Enabled"; "Disabled", "N/A" (a card that
    cannot do MIG) or no such element give False. A pending change (``pending_mig``) is
    not looked at: it takes effect only after a GPU reset. Raises ``MigXmlError`` for
    text it refuses.
    """
    return {
        uuid: _text(gpu, "mig_mode/current_mig") == "Enabled"
        for gpu in _root(text).findall("gpu")
        if (uuid := _text(gpu, "uuid")) is not None
    }


def merge_instances(
    listed: list[ListedCard], from_xml: dict[str, list[MigInstance]]
) -> dict[str, list[MigInstance]]:
    """Join ``parse_smi_list`` and ``parse_mig_xml`` results on (card UUID, device index).

    A joined device takes its UUID, profile and ``parent_index`` from ``-L`` and its
    instance ids and memory from the XML (the ids from ``-L`` where the XML has none).
    A device found in only one source is kept as that source gives it. Every card of
    either source has a key (``-L`` order first); devices are ordered by index.
    """
    merged: dict[str, list[MigInstance]] = {}
    listed_by_card = {card.uuid: card for card in listed}
    for card_uuid in [*listed_by_card, *(u for u in from_xml if u not in listed_by_card)]:
        card = listed_by_card.get(card_uuid)
        by_index: dict[int | None, MigInstance] = {}
        unindexed: list[MigInstance] = []
        for inst in from_xml.get(card_uuid, []):
            if inst.device_index is None:
                unindexed.append(inst)
            else:
                by_index[inst.device_index] = inst
        for inst in card.instances if card is not None else ():
            xml = by_index.get(inst.device_index)
            by_index[inst.device_index] = (
                inst
                if xml is None
                else replace(
                    inst,
                    gi_id=xml.gi_id if xml.gi_id is not None else inst.gi_id,
                    ci_id=xml.ci_id if xml.ci_id is not None else inst.ci_id,
                    memory_total=xml.memory_total,
                )
            )
        ordered = sorted(by_index.values(), key=lambda i: i.device_index or 0)
        merged[card_uuid] = ordered + unindexed
    return merged


def mig_cuda_visible(instance: MigInstance) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that selects this MIG device.

    A UUID that starts with ``MIG-`` is given as it is: ``MIG-<uuid>`` for drivers from
    R470 on, ``MIG-GPU-<card uuid>/<gi>/<ci>`` before, each the form CUDA of its driver
    takes. A bare UUID gets ``MIG-`` put before it. Raises ValueError when the instance
    has no MIG UUID (read from the XML alone: join it with ``-L`` first) or carries a
    card's ``GPU-`` UUID.
    """
    uuid = (instance.uuid or "").strip()
    if not uuid:
        raise ValueError(
            f"MIG device {instance.device_index} on {instance.parent_uuid} has no MIG UUID "
            "(nvidia-smi -q -x does not give one; take it from nvidia-smi -L)"
        )
    if uuid.startswith("MIG-"):
        return uuid
    if uuid.startswith("GPU-"):
        raise ValueError(f"{uuid} is a card's UUID, not a MIG device's")
    return f"MIG-{uuid}"


def cuda_visible_devices(cards: Sequence[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for an engine given ``cards``, the UUIDs its shard was
    placed on as the node reported them: a card's ``GPU-<uuid>``, or a MIG device's
    UUID, which NVML and ``nvidia-smi -L`` both give with its ``MIG-`` prefix (R470 on:
    ``MIG-<uuid>``; before: ``MIG-GPU-<card uuid>/<gi>/<ci>``) and which goes through
    ``mig_cuda_visible``. Empty for no card (the engine then sees none, not all).

    Raises ValueError for a MIG device beside any other card: CUDA enumerates one MIG
    device per process, so the engine would run on the first and leave the rest idle.
    """
    migs = [c for c in cards if c.startswith("MIG-")]
    if migs and len(cards) > 1:
        raise ValueError(
            f"a shard on MIG device {migs[0]} cannot use other cards too ({len(cards)} "
            "given): CUDA gives a process one MIG device. Give the profile 1 card, or "
            "serve it on cards with MIG off"
        )
    if migs:
        (card,) = migs
        return mig_cuda_visible(MigInstance(card, 0, card, None, None, None, None, None))
    return ",".join(cards)
