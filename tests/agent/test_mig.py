"""NVIDIA MIG: nvidia-smi -L and -q -x parsing, device classes, CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.discovery.mig import (
    ListedCard,
    MigInstance,
    MigXmlError,
    cuda_visible_devices,
    merge_instances,
    mig_cuda_visible,
    mig_enabled_cards,
    parse_mig_xml,
    parse_smi_list,
)
from llmgw.agent.discovery.smixml import SmiXmlError

FIXTURES = Path(__file__).parent / "fixtures" / "mig"
MiB = 1 << 20

H100_0 = "GPU-3f1c9a52-8e07-4b6d-a2c1-5d94e0b7a613"
H100_1 = "GPU-8b4d20e6-c93a-4f17-b5e8-07a1d6c3f92e"
H200 = "GPU-d2a7e4c9-61f0-4b38-9e5a-c8b3f1072d46"
OLD_0 = "GPU-6e1b8d4f-27ac-9c30-5f8e-d14a7b29c063"
OLD_1 = "GPU-b05c3e92-d47f-1a86-2e9b-70f4c81a5de7"
A100_CARVED = "GPU-9c4e2a71-5b3d-8f06-e1a9-47d2c0b8f315"
A100_EMPTY = "GPU-2d7f8b13-a6c0-4e95-3b1d-f08e6a9c2547"
A100_OFF = "GPU-e5a03c8d-19f2-7b64-c8e0-5d3a1f96b7e2"
A100_XML = "nvidia-smi-q-x_3xA100-80GB_mig-carved-empty-off_535.54.03.xml"


def read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def listed(
    card: str, index: int, uuid: str, profile: str, device: int, gi: int | None = None
) -> MigInstance:
    return MigInstance(
        parent_uuid=card,
        parent_index=index,
        uuid=uuid,
        gi_id=gi,
        ci_id=None if gi is None else 0,
        profile=profile,
        memory_total=None,
        device_index=device,
    )


def from_xml(card: str, index: int, device: int, gi: int, mib: int) -> MigInstance:
    return MigInstance(card, index, None, gi, 0, None, mib * MiB, device)


# --- nvidia-smi -L ---------------------------------------------------------------------


def test_list_h100_mig_card_and_plain_card() -> None:
    cards = parse_smi_list(read("nvidia-smi-L_2xH100_mig-and-plain_590.48.01.txt"))
    assert cards == [
        ListedCard(
            0,
            "NVIDIA H100 80GB HBM3",
            H100_0,
            (
                listed(H100_0, 0, "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158", "3g.40gb", 0),
                listed(H100_0, 0, "MIG-c4819f07-3a6e-5d21-b9f4-60e2a7c31d8b", "2g.20gb", 1),
                listed(H100_0, 0, "MIG-15d3b8e2-7c40-5a9f-a306-e8f1c2b4975d", "1g.10gb", 2),
                listed(H100_0, 0, "MIG-e90f6a1d-4b25-5c87-9d13-a7c5f0e2b846", "1g.10gb", 3),
            ),
        ),
        # A card with no MIG lines: MIG off, or on with nothing carved (-L cannot tell).
        ListedCard(1, "NVIDIA H100 80GB HBM3", H100_1, ()),
    ]


def test_list_h200_compute_instance_profiles() -> None:
    (card,) = parse_smi_list(read("nvidia-smi-L_H200_mig-compute-instances_590.48.01.txt"))
    assert (card.index, card.name, card.uuid) == (0, "NVIDIA H200", H200)
    assert card.instances == (
        listed(H200, 0, "MIG-2b9e4f61-d7a3-5c08-b1e6-94f2c5a07d3e", "1c.3g.71gb", 0),
        listed(H200, 0, "MIG-f6c1a893-2e5d-5b47-8a90-3d7e1b6c24f5", "2c.3g.71gb", 1),
        listed(H200, 0, "MIG-58d0e2b7-a4c9-5f16-9e3b-c1a6f8d4072e", "2g.35gb", 2),
        listed(H200, 0, "MIG-9e47c3a5-1f8b-5d62-a7c4-0b5e9d2f18a3", "1g.18gb", 3),
        listed(H200, 0, "MIG-a3f5d9c0-6b2e-5e81-b4d7-f9c2e0a5163b", "1g.18gb", 4),
    )


def test_list_legacy_mig_gpu_uuid_gives_instance_ids() -> None:
    cards = parse_smi_list(read("nvidia-smi-L_2xA100-40GB_legacy-mig-gpu-uuid_pre-470.txt"))
    assert [(c.index, c.name, c.uuid) for c in cards] == [
        (0, "A100-SXM4-40GB", OLD_0),
        (1, "A100-SXM4-40GB", OLD_1),
    ]
    assert cards[0].instances == (
        listed(OLD_0, 0, f"MIG-{OLD_0}/1/0", "3g.20gb", 0, gi=1),
        listed(OLD_0, 0, f"MIG-{OLD_0}/5/0", "2g.10gb", 1, gi=5),
        listed(OLD_0, 0, f"MIG-{OLD_0}/13/0", "1g.5gb", 2, gi=13),
    )
    assert [(i.profile, i.gi_id, i.ci_id) for i in cards[1].instances] == [
        ("1c.3g.20gb", 2, 0),
        ("2c.3g.20gb", 2, 1),
    ]
    assert all(i.parent_index == 1 for i in cards[1].instances)


def test_list_skips_junk_and_orphans() -> None:
    text = (
        "No devices were found\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-00000000-aaaa-5bbb-8ccc-000000000000)\n"
        "GPU 3: NVIDIA A100 80GB PCIe (UUID: GPU-11111111-2222-3333-4444-555555555555)\r\n"
        "  MIG 3g.40gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-5ccc-8ddd-eeeeeeeeeeee)\r\n"
        "  MIG 3g.40gb     Device  x: (UUID: MIG-aaaaaaaa-bbbb-5ccc-8ddd-ffffffffffff)\n"
        "  MIG 2g.20gb     Device  1: (UUID: GPU-aaaaaaaa-bbbb-5ccc-8ddd-eeeeeeeeeeee)\n"
        "  MIG 2g.20gb     Device  1: (UUID: MIG-GPU-99999999-2222-3333-4444-555555555555/3/0)\n"
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "GPU 4: garbled line without uuid\n"
    )
    (card,) = parse_smi_list(text)
    assert (card.index, card.name, card.uuid) == (
        3,
        "NVIDIA A100 80GB PCIe",
        "GPU-11111111-2222-3333-4444-555555555555",
    )
    assert [i.uuid for i in card.instances] == ["MIG-aaaaaaaa-bbbb-5ccc-8ddd-eeeeeeeeeeee"]


@pytest.mark.parametrize("text", ["", "\n\n", "No devices were found\n", "MIG 1g.10gb x"])
def test_list_without_cards_is_empty(text: str) -> None:
    assert parse_smi_list(text) == []


# --- nvidia-smi -q -x ------------------------------------------------------------------


def test_xml_carved_empty_and_off_cards() -> None:
    assert parse_mig_xml(read(A100_XML)) == {
        A100_CARVED: [
            from_xml(A100_CARVED, 0, 0, 2, 40192),
            from_xml(A100_CARVED, 0, 1, 3, 19968),
            from_xml(A100_CARVED, 0, 2, 9, 9728),
            from_xml(A100_CARVED, 0, 3, 10, 9728),
        ],
        A100_EMPTY: [],
        A100_OFF: [],
    }


def test_xml_mig_mode_tells_on_but_empty_from_off() -> None:
    assert mig_enabled_cards(read(A100_XML)) == {
        A100_CARVED: True,
        A100_EMPTY: True,
        A100_OFF: False,
    }


NON_MIG = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
    <gpu id="00000000:01:00.0">
        <product_name>NVIDIA GeForce RTX 4090</product_name>
        <mig_mode>
            <current_mig>N/A</current_mig>
            <pending_mig>N/A</pending_mig>
        </mig_mode>
        <mig_devices>
            None
        </mig_devices>
        <uuid>GPU-0badcafe-1111-2222-3333-444455556666</uuid>
    </gpu>
    <gpu id="00000000:02:00.0">
        <product_name>NVIDIA H100 80GB HBM3</product_name>
        <mig_mode>
            <current_mig>Enabled</current_mig>
            <pending_mig>Disabled</pending_mig>
        </mig_mode>
        <mig_devices>
            <mig_device>
                <index>N/A</index>
                <gpu_instance_id>7</gpu_instance_id>
                <compute_instance_id>N/A</compute_instance_id>
                <fb_memory_usage><total>N/A</total></fb_memory_usage>
            </mig_device>
        </mig_devices>
        <uuid>GPU-0badcafe-7777-8888-9999-aaaabbbbcccc</uuid>
    </gpu>
    <gpu id="00000000:03:00.0">
        <product_name>NVIDIA H100 80GB HBM3</product_name>
        <uuid>N/A</uuid>
    </gpu>
</nvidia_smi_log>
"""


def test_xml_non_mig_card_and_no_figure_words() -> None:
    rtx = "GPU-0badcafe-1111-2222-3333-444455556666"
    h100 = "GPU-0badcafe-7777-8888-9999-aaaabbbbcccc"
    assert parse_mig_xml(NON_MIG) == {
        rtx: [],
        h100: [MigInstance(h100, 1, None, 7, None, None, None, None)],
    }
    # N/A means the card cannot do MIG; a pending change does not count until reset.
    assert mig_enabled_cards(NON_MIG) == {rtx: False, h100: True}


@pytest.mark.parametrize(
    "text",
    [
        '<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n<!ENTITY x "y">\n]>\n'
        "<nvidia_smi_log><gpu><uuid>&x;</uuid></gpu></nvidia_smi_log>",
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd" [ ]>\n<nvidia_smi_log/>',
        "<!entity lol 'lol'><nvidia_smi_log/>",
    ],
)
def test_xml_with_entities_or_internal_subset_is_refused(text: str) -> None:
    for parse in (parse_mig_xml, mig_enabled_cards):
        with pytest.raises(MigXmlError, match="entities or a DOCTYPE internal subset"):
            parse(text)
    assert issubclass(MigXmlError, SmiXmlError) and issubclass(MigXmlError, ValueError)


@pytest.mark.parametrize(
    ("text", "words"),
    [("<nvidia_smi_log><gpu>", "not well-formed"), ("<other/>", "expected <nvidia_smi_log>")],
)
def test_xml_not_a_smi_log_is_refused(text: str, words: str) -> None:
    with pytest.raises(MigXmlError, match=words):
        parse_mig_xml(text)


# --- joining, classes, CUDA_VISIBLE_DEVICES -------------------------------------------


def test_merge_takes_uuid_and_profile_from_list_and_ids_memory_from_xml() -> None:
    card = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
    lone_xml = "GPU-aaaaaaaa-0000-0000-0000-000000000002"
    cards = [
        ListedCard(
            5,
            "NVIDIA A100-SXM4-80GB",
            card,
            (
                listed(card, 5, "MIG-11111111-0000-5000-8000-000000000001", "3g.40gb", 0),
                listed(card, 5, "MIG-11111111-0000-5000-8000-000000000002", "1g.10gb", 2),
            ),
        )
    ]
    xml = {
        card: [from_xml(card, 0, 1, 5, 19968), from_xml(card, 0, 0, 2, 40192)],
        lone_xml: [from_xml(lone_xml, 1, 0, 1, 40192)],
    }
    assert merge_instances(cards, xml) == {
        card: [
            MigInstance(
                card, 5, "MIG-11111111-0000-5000-8000-000000000001", 2, 0, "3g.40gb", 40192 * MiB, 0
            ),
            from_xml(card, 0, 1, 5, 19968),
            listed(card, 5, "MIG-11111111-0000-5000-8000-000000000002", "1g.10gb", 2),
        ],
        lone_xml: [from_xml(lone_xml, 1, 0, 1, 40192)],
    }


def test_merge_of_fixtures_keeps_legacy_ids_when_xml_has_none() -> None:
    cards = parse_smi_list(read("nvidia-smi-L_2xA100-40GB_legacy-mig-gpu-uuid_pre-470.txt"))
    merged = merge_instances(cards, {})
    assert [i.gi_id for i in merged[OLD_0]] == [1, 5, 13]
    assert list(merged) == [OLD_0, OLD_1]


@pytest.mark.parametrize(
    ("card_name", "card_mib", "profile", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "3g.40gb", "a100-80g-mig-3g.40gb"),
        ("NVIDIA H100 80GB HBM3", 81559, "1g.10gb", "h100-80g-mig-1g.10gb"),
        ("NVIDIA H200", 143771, "1g.18gb", "h200-141g-mig-1g.18gb"),
        ("NVIDIA H200", 143771, "1c.3g.71gb", "h200-141g-mig-1c.3g.71gb"),
        ("NVIDIA H100 NVL", 95830, "1g.12gb", "h100-94g-mig-1g.12gb"),
        ("NVIDIA A100-PCIE-40GB", 40536, "3g.20gb", "a100-40g-mig-3g.20gb"),
        ("A100-SXM4-40GB", None, "1g.5gb", "a100-40g-mig-1g.5gb"),
        ("NVIDIA A30", 24576, "2g.12gb", "a30-24g-mig-2g.12gb"),
        ("NVIDIA L40S", 46068, "1g.12gb", "l40s-48g-mig-1g.12gb"),
        ("NVIDIA GB200", 189471, "1g.23gb", "gb200-186g-mig-1g.23gb"),
        ("NVIDIA B200", 183359, "1g.23gb", "b200-180g-mig-1g.23gb"),
        ("NVIDIA GH200 480GB", 97871, "1g.12gb", "gh200-96g-mig-1g.12gb"),
        ("NVIDIA H200", None, "1g.18gb", "h200-mig-1g.18gb"),
        ("NVIDIA H100 80GB HBM3", 81559, "1g.10gb+me", "h100-80g-mig-1g.10gb-me"),
        ("NVIDIA H100 80GB HBM3", 81559, None, "h100-80g-mig-unknown"),
        (
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            97887,
            "1g.24gb",
            "rtx-pro-6000-blackwell-server-edition-96g-mig-1g.24gb",
        ),
        ("Weird Card 12GB!", 300 * 1024, "2g.x", "weird-card-300g-mig-2g.x"),
        ("", None, "1g.5gb", "gpu-mig-1g.5gb"),
    ],
)
def test_class_name(
    card_name: str, card_mib: int | None, profile: str | None, expected: str
) -> None:
    inst = MigInstance("GPU-x", 0, None, None, None, profile, None, 0)
    memory = None if card_mib is None else card_mib * MiB
    assert inst.class_name(card_name, memory) == expected


def test_class_names_of_fixture_instances() -> None:
    (h200,) = parse_smi_list(read("nvidia-smi-L_H200_mig-compute-instances_590.48.01.txt"))
    assert [i.class_name(h200.name, 143771 * MiB) for i in h200.instances] == [
        "h200-141g-mig-1c.3g.71gb",
        "h200-141g-mig-2c.3g.71gb",
        "h200-141g-mig-2g.35gb",
        "h200-141g-mig-1g.18gb",
        "h200-141g-mig-1g.18gb",
    ]
    h100 = parse_smi_list(read("nvidia-smi-L_2xH100_mig-and-plain_590.48.01.txt"))[0]
    assert h100.instances[2].class_name(h100.name, 81559 * MiB) == "h100-80g-mig-1g.10gb"


def test_cuda_visible_devices() -> None:
    new = listed("GPU-x", 0, "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158", "3g.40gb", 0)
    assert mig_cuda_visible(new) == "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158"
    old = listed(OLD_0, 0, f"MIG-{OLD_0}/1/0", "3g.20gb", 0, gi=1)
    assert mig_cuda_visible(old) == f"MIG-{OLD_0}/1/0"
    bare = listed("GPU-x", 0, "7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158", "3g.40gb", 0)
    assert mig_cuda_visible(bare) == "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158"


def test_cuda_visible_devices_refuses_what_cannot_select_a_mig_device() -> None:
    with pytest.raises(ValueError, match="nvidia-smi -L"):
        mig_cuda_visible(from_xml(A100_CARVED, 0, 0, 2, 40192))
    with pytest.raises(ValueError, match="card's UUID"):
        mig_cuda_visible(listed("GPU-x", 0, "GPU-x", "3g.40gb", 0))


def test_an_engines_visible_devices_name_a_mig_device_by_its_mig_uuid() -> None:
    new = "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158"
    assert cuda_visible_devices([new]) == new
    assert cuda_visible_devices([f"MIG-{OLD_0}/1/0"]) == f"MIG-{OLD_0}/1/0"
    assert cuda_visible_devices(["GPU-a", "GPU-b"]) == "GPU-a,GPU-b"
    assert cuda_visible_devices([]) == ""  # no card: the engine sees none, not all


@pytest.mark.parametrize(
    "cards",
    [
        ["MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158", "MIG-c4819f07-3a6e-5d21-b9f4-60e2a7c31d8b"],
        ["GPU-a", "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158"],
    ],
)
def test_a_mig_device_beside_another_card_is_refused(cards: list[str]) -> None:
    with pytest.raises(ValueError, match="CUDA gives a process one MIG device"):
        cuda_visible_devices(cards)
