"""CUDA numbering from NVML records: PCI order, CUDA_VISIBLE_DEVICES in all its forms, MIG."""

import pytest

from gputui.hw.cuda_order import NvmlGpu, cuda_env, cuda_order, pci_key

# NVML lists them in this order; their PCI bus ids put B (1A) first, then A (3B), then C (86).
A = NvmlGpu(0, "GPU-aaaa1111-0000", "NVIDIA A100", "00000000:3B:00.0")
B = NvmlGpu(1, "GPU-bbbb2222-0000", "NVIDIA A100", "00000000:1A:00.0")
C = NvmlGpu(2, "GPU-cccc3333-0000", "NVIDIA A100", "00000000:86:00.0")
GPUS = [A, B, C]


def uuids(order):
    return [d.uuid for d in order.devices]


def test_pci_key_reads_hex_fields():
    ids = ["00000001:00:00.0", "00000000:86:00.0", "00000000:1A:00.0", "00000000:3B:00.1",
           "00000000:3B:00.0"]
    assert sorted(ids, key=pci_key) == ["00000000:1A:00.0", "00000000:3B:00.0",
                                        "00000000:3B:00.1", "00000000:86:00.0",
                                        "00000001:00:00.0"]
    assert pci_key("garbage") > pci_key("00000000:86:00.0")


def test_unset_lists_every_gpu_in_pci_order():
    out = cuda_order(GPUS, None)
    assert uuids(out) == [B.uuid, A.uuid, C.uuid]
    assert out.reason == "" and out.notes == []


@pytest.mark.parametrize("visible, expected", [
    ("2,0", [C, B]),  # ordinals are CUDA's (PCI order), not NVML's
    ("1", [A]),
    ("1gpu,2x", [A, C]),  # read like strtoul: leading digits count
    (" 2 , 1 ", [C, A]),
    ("0,-1,1", [B]),  # an invalid entry ends the list
    ("0,5,1", [B]),  # so does an ordinal that does not exist
    ("0,x,1", [B]),
    ("GPU-cccc,GPU-aaaa1111-0000", [C, A]),  # UUIDs and UUID prefixes
    ("gpu-bbbb", [B]),
    ("GPU-cccc,GPU-ffff,GPU-aaaa", [C]),  # an unknown UUID ends the list
    ("GPU-cccc,1", [C]),  # a UUID list does not switch to ordinals
    ("1,GPU-cccc", [A]),  # nor an ordinal list to UUIDs
])
def test_cuda_visible_devices_forms(visible, expected):
    assert uuids(cuda_order(GPUS, visible, "PCI_BUS_ID")) == [g.uuid for g in expected]


@pytest.mark.parametrize("visible, reason", [
    ("", "CUDA_VISIBLE_DEVICES='' hides all 3 GPU(s) of this machine"),
    ("-1", "CUDA_VISIBLE_DEVICES='-1' hides all 3 GPU(s) of this machine"),
    ("NoDevFiles", "CUDA_VISIBLE_DEVICES='NoDevFiles' hides all 3 GPU(s) of this machine"),
    ("0,1,0", "CUDA_VISIBLE_DEVICES='0,1,0' names a device twice, which makes CUDA hide every "
              "GPU"),
    ("GPU-aaaa,GPU-aaaa1111", "CUDA_VISIBLE_DEVICES='GPU-aaaa,GPU-aaaa1111' names a device "
                              "twice, which makes CUDA hide every GPU"),
])
def test_lists_that_hide_every_gpu_say_why(visible, reason):
    out = cuda_order(GPUS, visible)
    assert out.devices == []
    assert out.reason == reason


def test_ambiguous_uuid_prefix_hides_every_gpu():
    twins = [NvmlGpu(0, "GPU-abc1", "X", "00000000:01:00.0"),
             NvmlGpu(1, "GPU-abc2", "X", "00000000:02:00.0")]
    out = cuda_order(twins, "GPU-abc")
    assert out.devices == []
    assert out.reason == "CUDA_VISIBLE_DEVICES='GPU-abc' hides every GPU: 'GPU-abc' matches several"


def test_mixed_models_note_unless_pci_bus_id_order():
    mixed = [A, NvmlGpu(1, "GPU-dddd", "NVIDIA T4", "00000000:AF:00.0")]
    assert len(cuda_order(mixed, None).notes) == 1
    fastest = cuda_order(mixed, None, "FASTEST_FIRST")
    assert fastest.notes[0].startswith("CUDA_DEVICE_ORDER is not PCI_BUS_ID and the GPUs differ")
    assert cuda_order(mixed, None, "PCI_BUS_ID").notes == []
    assert cuda_env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _mig_box():
    m1 = NvmlGpu(2, "MIG-1111aaaa", "A100 MIG 3g.20gb", C.pci_bus_id, parent_uuid=C.uuid,
                 mig_index=0, gi=1, ci=0)
    m2 = NvmlGpu(2, "MIG-2222bbbb", "A100 MIG 3g.20gb", C.pci_bus_id, parent_uuid=C.uuid,
                 mig_index=1, gi=2, ci=0)
    mig_c = NvmlGpu(2, C.uuid, C.name, C.pci_bus_id, migs=(m1, m2))
    return [A, B, mig_c], m1, m2


def test_mig_devices_replace_their_parent():
    gpus, m1, m2 = _mig_box()
    out = cuda_order(gpus, None)
    assert uuids(out) == [B.uuid, A.uuid, m1.uuid, m2.uuid]
    assert any(n.startswith("MIG is enabled") for n in out.notes)
    assert uuids(cuda_order(gpus, "2")) == [m1.uuid, m2.uuid]
    assert uuids(cuda_order(gpus, "MIG-2222")) == [m2.uuid]
    assert uuids(cuda_order(gpus, "MIG-2222,MIG-1111")) == [m2.uuid, m1.uuid]
    # CUDA 11.0's form names the parent GPU and the GPU/compute instance ids.
    assert uuids(cuda_order(gpus, "MIG-GPU-cccc3333-0000/1/0")) == [m1.uuid]
    assert uuids(cuda_order(gpus, "MIG-GPU-cccc3333-0000/9/0")) == []
    # The parent's GPU- UUID names no usable CUDA device while MIG is on.
    assert uuids(cuda_order(gpus, f"{C.uuid}")) == []
